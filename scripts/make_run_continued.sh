#!/usr/bin/env bash
# `make run-continued`: continued pretraining (model.init_from) from the newest model `make run` left in
# OUTPUT_ROOT, with real Airflow, for CONTINUED_MINUTES (default 3): its tokenizer encodes the shards,
# its weights are the start, and its report shows both runs side by side. Not part of `make run`: a
# minute of it made the model worse (issue 32), and it is a demo of a feature, not of the first model.
set -euo pipefail
cd "$(dirname "$0")/.."
OUTPUT_ROOT=${OUTPUT_ROOT:-$PWD/out}
MINUTES=${CONTINUED_MINUTES:-3}
LOG="$AIRFLOW_HOME/continued_run.log"
first=$(ls -t "$OUTPUT_ROOT"/runs/*/summary.txt 2>/dev/null | head -1 || true)
if [[ -z "$first" ]]; then
  echo "No finished run under $OUTPUT_ROOT: run \`make run\` first (same OUTPUT_ROOT)."; exit 1
fi
base=$(dirname "$first")/model
mkdir -p "$AIRFLOW_HOME"
.venv/bin/airflow db migrate >"$AIRFLOW_HOME/db_migrate.log" 2>&1 || { tail -20 "$AIRFLOW_HOME/db_migrate.log"; exit 1; }
echo "Continuing from $base for $MINUTES minute(s) (model.init_from) — full log: $LOG"
start=$(date +%s)
.venv/bin/airflow dags test mlm_pretrain \
  -c "{\"output_root\": \"$OUTPUT_ROOT\", \"init_from\": \"$base\", \"overrides\": {\"train.budget_minutes\": $MINUTES}}" \
  2>&1 | tee "$LOG" | grep --line-buffered -E "mlm_tasks\.|DagRun Finished" \
  | sed -u -E 's/ \[(mlm_tasks[^]]*)\] loc=.*$//; s/^[0-9T:.-]+Z //' || true
if ! grep "DagRun Finished" "$LOG" | grep -q "state=success"; then
  echo "The continued run did not succeed: see $LOG"; exit 1
fi
continued=$(ls -t "$OUTPUT_ROOT"/runs/*/summary.txt | head -1)
echo
cat "$continued"
echo "Wall time  $(($(date +%s) - start)) s"
echo "Both runs side by side: $(dirname "$continued")/report/report.md (all runs under output_root)"
