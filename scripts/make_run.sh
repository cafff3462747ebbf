#!/usr/bin/env bash
# `make run`: the mlm_pretrain DAG with real Airflow (`airflow dags test`, SQLite, project-local
# AIRFLOW_HOME) on the embedded default; prints the run summary, wall time and peak memory.
set -euo pipefail
cd "$(dirname "$0")/.."
OUTPUT_ROOT=${OUTPUT_ROOT:-$PWD/out}
mkdir -p "$AIRFLOW_HOME"
LOG="$AIRFLOW_HOME/last_run.log"
echo "Preparing Airflow metadata DB in $AIRFLOW_HOME ..."
.venv/bin/airflow db migrate >"$AIRFLOW_HOME/db_migrate.log" 2>&1 || { tail -20 "$AIRFLOW_HOME/db_migrate.log"; exit 1; }
echo "Running DAG mlm_pretrain (embedded Wikipedia sample, CPU) — full log: $LOG"
start=$(date +%s)
set +e
/usr/bin/time -v -o "$AIRFLOW_HOME/time.txt" .venv/bin/airflow dags test mlm_pretrain \
  -c "{\"output_root\": \"$OUTPUT_ROOT\"}" ${MLM_RUN_ARGS:-} 2>&1 | tee "$LOG" \
  | grep --line-buffered -E "mlm_tasks\.|DagRun Finished|Task instance state updated.*new_state=(failed|up_for_retry)" \
  | sed -u -E 's/ \[(mlm_tasks[^]]*)\] loc=.*$//; s/^[0-9T:.-]+Z //'
status=${PIPESTATUS[0]}
set -e
end=$(date +%s)
summary=$(ls -t "$OUTPUT_ROOT"/runs/*/summary.txt 2>/dev/null | head -1 || true)
echo
if [[ -n "$summary" ]] && grep -q "state=success" <(grep "DagRun Finished" "$LOG"); then
  cat "$summary"
else
  echo "The run did not succeed: see $LOG"; status=1
fi
rss_kb=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$AIRFLOW_HOME/time.txt")
echo "Wall time  $((end - start)) s; peak memory $((rss_kb / 1024)) MiB (largest process)"

[[ "$status" == 0 ]] && echo "Next: \`make run-continued\` continues pretraining from this model (model.init_from)."
exit "$status"
