"""The restarts a train task records in the status record (mlm_tasks/training/restarts.py), closed by the
next trainer's StatusRecord at its start step."""

from mlm_tasks.paths import RunPaths
from mlm_tasks.training import restarts
from mlm_tasks.training.status import StatusRecord, read_status


def test_a_restart_is_recorded_then_closed_by_the_next_trainer(tmp_path):
    run = RunPaths(str(tmp_path), "r1")
    with StatusRecord(run, total_steps=100, start_step=0, heartbeat_s=60) as first:
        first.progress(37, 1.0, None, None)
    recorded = restarts.record_restart(run, cause="the TPU VM n is PREEMPTED", node="n", try_number=1)
    assert [(r["step"], r["resumed_from"]) for r in recorded] == [(37, None)]
    assert read_status(run)["restarts"] == recorded  # kept where everybody reads the run's progress

    with StatusRecord(run, total_steps=100, start_step=30, heartbeat_s=60):  # resumes at its checkpoint
        pass
    (closed,) = read_status(run)["restarts"]
    assert (closed["resumed_from"], closed["steps_lost"], closed["cause"]) == (30, 7, "the TPU VM n is PREEMPTED")
    with StatusRecord(run, total_steps=100, start_step=30, heartbeat_s=60):  # a later start changes nothing
        pass
    assert read_status(run)["restarts"] == [closed]
    assert restarts.summary_line([closed]).startswith("1 restart(s), 7 step(s) retrained after them")
    assert restarts.summary_line([]) == "no restarts"


def test_a_restart_before_any_record_is_only_counted(tmp_path):
    run = RunPaths(str(tmp_path), "r2")
    assert restarts.record_restart(run, cause="lost", node="n", try_number=1)[0]["step"] == 0
    assert read_status(run) is None  # no record to add it to: the task state store still counts it
