"""approve_release: a person approves the model before `publish` runs (`publish.require_approval`).

    decision = gate(config)
    approval = ReleaseApprovalOperator(task_id="approve_release", config=config, decision=decision)
    chain(decision, approval, publish(config, decision, data))     # publish: trigger_rule none_failed

Airflow's ApprovalOperator with the review page (mlm_tasks/reporting/review.py) as its body (docs/releases.md).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, cast

from airflow.providers.standard.operators.hitl import ApprovalOperator
from airflow.sdk import Context, Param
from airflow.sdk.exceptions import AirflowSkipException

from mlm_airflow.tasks.step_context import config_from_xcom, step_context, xcom_dict
from mlm_tasks.results import GateDecision

COMMENT = "comment"


class ReleaseApprovalOperator(ApprovalOperator):
    template_fields = (*ApprovalOperator.template_fields, "config", "decision")

    def __init__(
        self, *, config: Any, decision: Any, default_timeout_hours: float = 72, params: Any = None, **kwargs: Any
    ) -> None:
        # `params` (the DAG's form, merged in by Airflow) is dropped: HITLOperator's form is the comment alone.
        # response_timeout keeps HITLOperator from taking execution_timeout as the deadline; execute() sets the run's.
        super().__init__(
            subject="Publish this run's model?",
            defaults=ApprovalOperator.REJECT,
            response_timeout=timedelta(hours=default_timeout_hours),
            # Optional (null allowed): the form would otherwise refuse an answer without one.
            params={
                COMMENT: Param(
                    None,
                    type=["null", "string"],
                    title="Comment",
                    source="task",
                    description="Why you approve or reject; it goes to the task log.",
                )
            },
            **kwargs,
        )
        self.config = config
        self.decision = decision

    def execute(self, context: Context) -> Any:
        cfg = config_from_xcom(self.config)
        # The gate's decision is read only when approval is asked for: a run may skip the gate or mark it done
        # without one (`airflow dags test --mark-success-pattern`).
        if not cfg.publish.require_approval:
            raise AirflowSkipException(
                "No approval asked (publish.require_approval is false): publish decides on its own."
            )
        decision = cast(GateDecision, xcom_dict(self.decision))
        if not cfg.publish.enabled:
            raise AirflowSkipException("Publishing is off (publish.enabled=false): nothing to approve.")
        if not decision.get("passed"):
            raise AirflowSkipException(
                "The evaluation gate failed: nothing to approve (publish skips, with the gate's reasons)."
            )
        from mlm_tasks.config.deployment import Deployment
        from mlm_tasks.reporting.review import review_markdown

        deployment = Deployment.load()
        if deployment and deployment.approvers:  # only they may answer (the api-server checks assigned_users)
            self.assigned_users = [{"id": a.id, "name": a.name} for a in deployment.approvers]
        _, ctx = step_context(cfg)  # the run's GCP connection, for artifacts under gs://
        self.subject = f"Publish run {context['run_id']} to {cfg.publish.repo_id}?"
        self.body = review_markdown(cfg, ctx.run, decision)
        self.response_timeout = timedelta(hours=cfg.publish.approval_timeout_hours)
        self.log.info(
            "Waiting up to %g h for %s to approve or reject publishing to %s (Required actions in the "
            "UI, or the REST API's hitlDetails).",
            cfg.publish.approval_timeout_hours,
            ", ".join(u["name"] for u in self.assigned_users or []) or "a person",
            cfg.publish.repo_id,
        )
        return super().execute(context)

    def execute_complete(self, context: Context, event: dict[str, Any]) -> Any:
        if "error" not in event:
            self.log.info("%s", self.outcome(event))
        return super().execute_complete(context, event)

    @staticmethod
    def outcome(event: dict[str, Any]) -> str:
        """One line for the log: who answered what and why, or that nobody answered in time."""
        chosen = (event.get("chosen_options") or [None])[0]
        if event.get("timedout"):
            return (
                "No answer before publish.approval_timeout_hours ran out: that counts as a rejection, so "
                "publish is skipped. Trigger a new run (or clear approve_release) to ask again."
            )
        user = event.get("responded_by_user") or {}
        comment = (event.get("params_input") or {}).get(COMMENT) or "no comment given"
        who = user.get("name") or user.get("id") or "someone"
        if chosen == ApprovalOperator.APPROVE:
            return f"Approved by {who} ({comment}): publish runs."
        return f"Rejected by {who}: {comment}. publish is skipped."
