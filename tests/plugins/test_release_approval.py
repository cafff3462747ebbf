"""approve_release (plugins/mlm_airflow/operators/release_approval.py) on the operator of the real DAG, without a stack:
when it skips itself, and what a timeout does. Approve and reject through the REST API on the real
stack, and the form in a browser: tests/deploy/test_approval.py."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone

import pytest

pytest.importorskip("airflow")

from airflow.sdk.exceptions import AirflowSkipException, DownstreamTasksSkipped

from mlm_tasks.config import load_config

PASSED = {"passed": True, "reasons": ["no gate checks configured."]}


@pytest.fixture(scope="module")
def approval():
    from pathlib import Path

    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(Path(__file__).resolve().parents[2] / "dags"))
    assert not bag.import_errors, bag.import_errors
    return bag.dags["mlm_pretrain"].get_task("approve_release")


def _config(**publish) -> dict:
    overrides = {f"publish.{k}": v for k, v in publish.items()}
    return load_config("configs/tiny.yaml", overrides).model_dump(mode="json")


@pytest.mark.parametrize(
    ("publish", "decision", "reason"),
    [
        ({"enabled": True, "repo_id": "o/m"}, PASSED, "publish.require_approval is false"),
        ({"require_approval": True}, PASSED, "Publishing is off"),
        (
            {"require_approval": True, "enabled": True, "repo_id": "o/m"},
            {"passed": False, "reasons": ["eval loss 9.0 is above gate.max_eval_loss 5.0."]},
            "evaluation gate failed",
        ),
    ],
)
def test_nothing_to_approve_skips_itself_and_leaves_publish_to_decide(approval, publish, decision, reason):
    approval.config, approval.decision = _config(**publish), decision
    with pytest.raises(AirflowSkipException, match=reason):
        approval.execute({"run_id": "r"})


class _TaskInstance:
    """What ApprovalOperator's skip uses of the running task instance."""

    map_index = -1

    def __init__(self):
        self.xcom = {}

    def xcom_push(self, key, value):
        self.xcom[key] = value


def _timeout_event(approval) -> dict:
    """The event the scheduler's timeout sweep resumes the task with (check_awaiting_input_timeouts in
    airflow/jobs/scheduler_job_runner.py): the request's defaults as the answer, nobody as the user."""
    from airflow.models.hitl import HITLDetail

    detail = HITLDetail(
        ti_id=uuid.uuid4(),
        options=approval.options,
        subject=approval.subject,
        defaults=approval.defaults,
        multiple=False,
        params=approval.serialized_params,
    )
    detail.chosen_options = list(detail.defaults)
    detail.params_input = {k: v["value"] for k, v in detail.params.items()}
    detail.responded_by, detail.responded_at = None, datetime.now(timezone.utc)
    return detail.as_resume_event_payload(timedout=True)


def test_no_answer_in_time_is_a_rejection_that_skips_publish_only(approval):
    event = _timeout_event(approval)
    assert event["chosen_options"] == ["Reject"] and event["responded_by_user"] is None
    ti = _TaskInstance()
    approval.config = _config(require_approval=True, enabled=True, repo_id="o/m")
    # The task itself succeeds (no exception of its own): Airflow skips publish, summary still runs.
    with pytest.raises(DownstreamTasksSkipped) as skipped:
        approval.execute_complete({"task": approval, "ti": ti}, event)
    assert skipped.value.tasks == ["publish"]
    assert "counts as a rejection, so publish is skipped" in approval.outcome(event)


def test_the_log_line_names_who_answered_and_why(approval):
    answer = {
        "chosen_options": ["Reject"],
        "params_input": {"comment": "val loss still falling"},
        "responded_by_user": {"id": "7", "name": "alice"},
        "timedout": False,
    }
    assert approval.outcome(answer) == "Rejected by alice: val loss still falling. publish is skipped."
    assert approval.outcome({**answer, "chosen_options": ["Approve"], "params_input": {"comment": ""}}) == (
        "Approved by alice (no comment given): publish runs."
    )
