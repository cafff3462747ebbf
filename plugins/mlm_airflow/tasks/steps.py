"""The Airflow tasks of the pipeline's steps: each calls the `mlm_tasks` step of the same name and returns its result
(mlm_tasks/results.py) as one XCom; steps are imported in the task bodies, so a DAG parses without TensorFlow.

    config = validate()                          # the validated config, for every later task
    check_run(config, data)                      # data: shard_set(config)
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from airflow.sdk import get_current_context, task
from airflow.sdk.exceptions import AirflowSkipException

from mlm_airflow.defaults import CPU_QUEUE
from mlm_airflow.tasks.step_context import bad_input_fails_fast, step_context
from mlm_tasks import results

log = logging.getLogger(__name__)


@task(retries=0, multiple_outputs=False)  # retrying cannot fix a bad input: fail now, with what to change
def validate(probe_write: bool = True, **context: Any) -> results.ValidatedConfig:
    """First task: every setting and input checked, before anything costs time or money.
    `probe_write=False`: output_root is not written to (the dataset refresh of an unchanged source).
    A dataset-refresh event's output_root and data settings replace the form's; a deployment file
    (mlm_tasks/config/deployment.py) limits the form, the REST conf and the event to run settings."""
    from mlm_airflow.assets import triggering_shards_event
    from mlm_airflow.defaults import distributed_executor, shared_output_roots
    from mlm_tasks.config.deployment import Deployment, run_config
    from mlm_tasks.steps.validate import validate as step

    with bad_input_fails_fast():
        deployment = Deployment.for_airflow()
        cfg = run_config(context["params"], deployment, triggering_shards_event(context, deployment))
        cfg, _ = step_context(cfg)  # validate probes output_root with the connection's credentials
        return step(
            cfg,
            distributed_executor=distributed_executor(),
            shared_roots=shared_output_roots(),
            probe_write=probe_write,
        )


@task(multiple_outputs=False)
def check_run(config: dict, data: results.DataSummary) -> results.RunCheck:
    """The run against its data (batch vs records, max_length, tokenizer, an earlier checkpoint)."""
    from mlm_tasks.steps.check_run import check_run as step

    with bad_input_fails_fast():
        cfg, ctx = step_context(config, data)
        return step(cfg, ctx, data=data)


def _where_trained(name: str, step: Callable[..., Any], config: dict, data: Any = None, *vm_args: str) -> Any:
    """`step` on this worker, or with `compute: tpu_vm` as `python -m mlm_tasks <name>` on the run's TPU VM."""
    from mlm_airflow.operators.remote_step import step_on_vm

    with bad_input_fails_fast():
        cfg, ctx = step_context(config, data)
        if cfg.compute == "tpu_vm":
            return step_on_vm(get_current_context(), cfg, name, vm_args)
        return step(cfg, ctx)


@task(queue=CPU_QUEUE, multiple_outputs=False)
def evaluate(config: dict, data: results.DataSummary) -> results.EvalMetrics:
    from mlm_tasks.steps.evaluate import evaluate as step

    return _where_trained("evaluate", step, config, data, "--data-fingerprint", data["fingerprint"])


@task(queue=CPU_QUEUE, multiple_outputs=False)
def downstream(config: dict) -> results.DownstreamResult:
    """Fine-tunes the trained encoder on downstream.tasks (N seeds, and from random weights); the table."""
    from mlm_tasks.steps.downstream import downstream as step

    return _where_trained("downstream", step, config)


@task(queue=CPU_QUEUE)
def fill_mask(config: dict) -> list[results.ProbePredictions]:
    from mlm_tasks.steps.fill_mask import fill_mask as step

    return _where_trained("fill_mask", step, config)


@task(queue=CPU_QUEUE, multiple_outputs=False)
def report(config: dict, data: results.DataSummary) -> results.KeyMetrics:
    """Loss/LR curves, metrics table and fill-mask examples in runs/<run>/report/; key metrics as XCom."""
    from mlm_tasks.steps.report import report as step

    with bad_input_fails_fast():
        return step(*step_context(config, data), data=data)


@task(multiple_outputs=False)
def gate(config: dict) -> results.GateDecision:
    """Whether this run's model may be published; the reasons go to the log and XCom."""
    from mlm_tasks.steps.gate import gate as step

    with bad_input_fails_fast():
        return step(*step_context(config))


@task(multiple_outputs=False)
def publish(
    config: dict, decision: results.GateDecision, data: results.DataSummary, approval: Any = None
) -> results.ModelCommit:
    """`approval`: approve_release's HITL answer (None when skipped or marked done by hand). With
    publish.require_approval only a recorded Approve by a deployment approver lets it push."""
    from mlm_airflow.connections import hub_credentials
    from mlm_tasks.config.deployment import Deployment, check_approval
    from mlm_tasks.steps.publish import publish as step

    cfg, ctx = step_context(config, data)
    if not cfg.publish.enabled:
        raise AirflowSkipException("Publishing is off (publish.enabled=false): nothing pushed to the Hub.")
    if not decision["passed"]:
        raise AirflowSkipException("Not published: the evaluation gate failed:\n  " + "\n  ".join(decision["reasons"]))
    with bad_input_fails_fast():
        if cfg.publish.require_approval:
            deployment = Deployment.load()
            log.info("%s", check_approval(approval, deployment.approvers if deployment else []))
        token, endpoint = hub_credentials(cfg.publish.hf_conn_id)
        return step(cfg, ctx, token=token, endpoint=endpoint, data_info=data)


@task(multiple_outputs=False)
def publish_tokenizer(config: dict, data: results.DataSummary) -> results.TokenizerCommit:
    from mlm_airflow.connections import hub_credentials
    from mlm_tasks.steps.publish_tokenizer import publish_tokenizer as step

    cfg, ctx = step_context(config, data)
    if not cfg.publish.tokenizer_repo_id:
        raise AirflowSkipException("publish.tokenizer_repo_id is empty: the tokenizer is not pushed on its own.")
    token, endpoint = hub_credentials(cfg.publish.hf_conn_id)
    with bad_input_fails_fast():
        return step(cfg, ctx, token=token, endpoint=endpoint)


# Runs when publishing was skipped too: the summary is wanted either way.
@task(trigger_rule="none_failed", multiple_outputs=False)
def summary(config: dict, data: results.DataSummary) -> results.RunSummary:
    """Last task: one readable summary of the run in the log and runs/<run>/summary.txt, and as XCom."""
    from mlm_tasks.steps.summary import summary as step

    with bad_input_fails_fast():
        return step(*step_context(config, data), data=data)
