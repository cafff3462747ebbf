"""Airflow callables for the pipeline's steps: read params and XCom, call `mlm_tasks`, return small dicts.

No ML logic lives here: each callable turns the Airflow context into plain arguments for one
`mlm_tasks` step. TensorFlow and transformers are imported by the steps themselves, at run time,
so parsing a DAG that uses these stays fast.
"""
from __future__ import annotations

import logging
from typing import Any

from mlm_tasks.config import PipelineConfig, config_from_params
import shard_fanout
from hub_connection import hub_credentials
from task_errors import bad_input_fails_fast

log = logging.getLogger(__name__)

CONFIG_XCOM = "{{ ti.xcom_pull(task_ids='validate_config') }}"


def _config(ti) -> PipelineConfig:
    """The run's config; gs:// and TPU clients of this task then use the run's GCP connection."""
    from gcp_credentials import install_for

    cfg = PipelineConfig.model_validate(ti.xcom_pull(task_ids="validate_config"))
    install_for(cfg)
    return cfg


def _fingerprint(ti) -> str:
    return ti.xcom_pull(task_ids="prepare_data")["fingerprint"]


def validate_config(params: dict, **context: Any) -> dict:
    """First task: every setting and input checked, before anything costs time or money.

    A run scheduled by a dataset-refresh event trains on exactly that event's data: its output_root
    and data settings replace the form's, so the shards found are the ones the event announced.
    """
    from mlm_assets import triggering_shards_event
    from mlm_tasks.validate import validate_inputs
    from worker_queues import distributed_executor, shared_output_roots

    # Retrying cannot fix a bad input: fail now, with what to change.
    with bad_input_fails_fast():
        cfg = config_from_params(params)
        event = triggering_shards_event(context)
        if event:
            log.info("Triggered by dataset refresh: fingerprint %s under %s", event["fingerprint"],
                     event["output_root"])
            tree = cfg.model_dump(mode="json")
            tree.update(event["data_config"], output_root=event["output_root"])
            cfg = PipelineConfig.model_validate(tree)
        from gcp_credentials import install_for

        install_for(cfg)  # validate_inputs probes output_root with the connection's credentials
        validate_inputs(cfg, distributed_executor=distributed_executor(), shared_roots=shared_output_roots())
    return cfg.model_dump(mode="json")


def plan_shards(ti, **context: Any) -> list[dict]:
    """Fingerprint the data and train its tokenizer; the partitions `write_shards` maps over (none when
    the shard set is complete, or when a dataset-refresh event names the set to train on)."""
    from mlm_assets import triggering_shards_event
    from mlm_tasks.prepare import plan_data, summary_for_fingerprint

    cfg = _config(ti)
    event = triggering_shards_event(context)
    with bad_input_fails_fast():
        if event:  # exactly the announced data, never a re-fingerprint of a source that moved on
            plan = {"fingerprint": summary_for_fingerprint(cfg, event["fingerprint"])["fingerprint"],
                    "cache_hit": True, "partitions": []}
        else:
            plan = plan_data(cfg)
    return shard_fanout.hand_out(ti, plan)


def write_shards(part: int, num_parts: int, ti, **_: Any) -> dict:
    """One mapped task per corpus partition: its TFRecord shards and partial manifest."""
    return shard_fanout.write_partition(_config(ti), ti, part, num_parts)


def prepare_data(ti, run_id: str, **_: Any) -> dict:
    """Merge the partitions into one manifest (or find the complete set), then check the run against
    the data: still before any TPU VM exists."""
    from mlm_tasks.prepare import finish_data
    from mlm_tasks.validate import check_run_inputs

    cfg = _config(ti)
    plan = shard_fanout.planned(ti)
    with bad_input_fails_fast():
        summary = finish_data(cfg, plan["fingerprint"], plan["cache_hit"], plan["corpus_fingerprint"])
        check_run_inputs(cfg, run_id, summary["fingerprint"])
    return summary


def evaluate(ti, run_id: str, **_: Any) -> dict:
    from mlm_tasks.evaluate import evaluate as step

    with bad_input_fails_fast():
        return step(_config(ti), run_id, _fingerprint(ti))


def fill_mask(ti, run_id: str, **_: Any) -> list[dict]:
    from mlm_tasks.infer import fill_mask as step

    with bad_input_fails_fast():
        return step(_config(ti), run_id)


def summarize(ti, run_id: str, **_: Any) -> dict:
    """Last task: one readable summary of the run in the log, and as XCom for the UI."""
    from mlm_tasks import storage
    from mlm_tasks.paths import RunPaths
    from mlm_tasks.summary import run_summary

    cfg = _config(ti)
    summary = run_summary(cfg, run_id, ti.xcom_pull(task_ids="prepare_data"))
    storage.write_text(RunPaths(cfg.output_root, run_id).summary_text, summary["text"] + "\n")
    log.info("Run summary:\n%s", summary["text"])
    return summary


def report(ti, run_id: str, **_: Any) -> dict:
    """Loss/LR curves, metrics table and fill-mask examples in runs/<run>/report/; key metrics as XCom."""
    from mlm_tasks import storage
    from mlm_tasks.paths import RunPaths
    from mlm_tasks.report import build_report

    cfg = _config(ti)
    run = RunPaths(cfg.output_root, run_id)
    data = ti.xcom_pull(task_ids="prepare_data")
    storage.write_json(run.data_ref, data)
    return build_report(run, cfg, data_info=data)


def gate(ti, run_id: str, **_: Any) -> dict:
    """Decide whether this run's model may be published; the reasons go to the log and XCom."""
    from mlm_tasks.gate import gate_run
    from mlm_tasks.paths import RunPaths

    cfg = _config(ti)
    decision = gate_run(cfg, RunPaths(cfg.output_root, run_id)).to_dict()
    log.info("Evaluation gate %s:\n  %s", "passed" if decision["passed"] else "failed",
             "\n  ".join(decision["reasons"]))
    return decision


def publish(ti, run_id: str, **_: Any) -> dict:
    from airflow.exceptions import AirflowSkipException

    from mlm_tasks.paths import RunPaths
    from mlm_tasks.publish import publish_model

    cfg = _config(ti)
    if not cfg.publish.enabled:
        raise AirflowSkipException("Publishing is off (publish.enabled=false): nothing pushed to the Hub.")
    decision = ti.xcom_pull(task_ids="gate")
    if not decision["passed"]:
        raise AirflowSkipException("Not published: the evaluation gate failed:\n  " + "\n  ".join(decision["reasons"]))
    token, endpoint = hub_credentials(cfg.publish.hf_conn_id)
    return publish_model(cfg, RunPaths(cfg.output_root, run_id), token, endpoint)


def publish_tokenizer(ti, **_: Any) -> dict:
    from airflow.exceptions import AirflowSkipException

    from mlm_tasks.paths import DataPaths
    from mlm_tasks.publish import publish_tokenizer as step

    cfg = _config(ti)
    if not cfg.publish.tokenizer_repo_id:
        raise AirflowSkipException("publish.tokenizer_repo_id is empty: the tokenizer is not pushed on its own.")
    token, endpoint = hub_credentials(cfg.publish.hf_conn_id)
    return step(cfg, DataPaths(cfg.output_root, _fingerprint(ti)), token, endpoint)
