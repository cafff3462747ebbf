"""The restarts a train task records in runs/<run>/train/restarts.json (mlm_tasks/job/restarts.py),
closed by the next trainer's StatusRecord at its start step."""

from mlm_tasks.job import restarts
from mlm_tasks.job.status import StatusRecord, read_status
from mlm_tasks.paths import RunPaths


def test_a_restart_is_recorded_then_closed_by_the_next_trainer(tmp_path):
    run = RunPaths(str(tmp_path), "r1")
    with StatusRecord(run, total_steps=100, start_step=0, heartbeat_s=60) as first:
        first.progress(37, 1.0, None, None)
    recorded = restarts.record_restart(run, cause="the TPU VM n is PREEMPTED", node="n", try_number=1, step=37)
    assert [(r["step"], r["resumed_from"]) for r in recorded] == [(37, None)]
    assert restarts.read_restarts(run) == recorded

    with StatusRecord(run, total_steps=100, start_step=30, heartbeat_s=60):  # resumes at its checkpoint
        pass
    (closed,) = restarts.read_restarts(run)
    assert (closed["resumed_from"], closed["steps_lost"], closed["cause"]) == (30, 7, "the TPU VM n is PREEMPTED")
    assert read_status(run)["restarts"] == [closed]  # the trainer's copy, where whoever watches the run reads
    with StatusRecord(run, total_steps=100, start_step=30, heartbeat_s=60):  # a later start changes nothing
        pass
    assert restarts.read_restarts(run) == [closed]
    assert restarts.summary_line([closed]).startswith("1 restart(s), 7 step(s) retrained after them")
    assert restarts.summary_line([]) == "no restarts"


def test_a_lost_trainer_that_writes_its_record_late_keeps_the_restart(tmp_path):
    """A trainer on a node being preempted may rewrite its status record after the task recorded the loss
    (its heartbeat, its notice): kept in the status record, the restart was overwritten and lost."""
    run = RunPaths(str(tmp_path), "r2")
    assert restarts.read_restarts(run) == []
    with StatusRecord(run, total_steps=100, start_step=0, heartbeat_s=60) as lost:
        lost.progress(12, 1.0, None, None)
        restarts.record_restart(run, cause="the TPU VM n is PREEMPTED", node="n", try_number=1, step=12)
        lost.progress(13, 1.0, None, None)  # after the task saw it lost
    (kept,) = restarts.read_restarts(run)
    assert (kept["step"], kept["resumed_from"]) == (12, None)
    with StatusRecord(run, total_steps=100, start_step=10, heartbeat_s=60):  # the next trainer
        pass
    assert [(r["step"], r["resumed_from"]) for r in read_status(run)["restarts"]] == [(12, 10)]
