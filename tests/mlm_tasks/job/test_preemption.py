"""The metadata server's notices (mlm_tasks/job/preemption.py): an announced maintenance or a preemption seen by
the poller sets the notice, as SIGTERM does, against a metadata peer on loopback that refuses a request without
`Metadata-Flavor: Google`, as Google's does."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler
from types import SimpleNamespace

import pytest

from mlm_tasks.job import preemption
from peers.loopback_http import LoopbackServer


class MetadataServer(LoopbackServer):
    """instance/maintenance-event and instance/preempted, answered from `values`; every request is counted."""

    def __init__(self, **values: str) -> None:
        self.values = {"maintenance-event": "NONE", "preempted": "FALSE", **values}
        self.refused = 0
        self.asked = threading.Event()
        peer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                name = self.path.rsplit("/", 1)[-1]
                if self.headers.get("Metadata-Flavor") != "Google":
                    peer.refused += 1
                    self.send_error(403, "Missing Metadata-Flavor:Google header")
                    return
                if not self.path.startswith("/computeMetadata/v1/instance/") or name not in peer.values:
                    self.send_error(404)
                    return
                body = peer.values[name].encode()
                self.send_response(200)
                self.send_header("Metadata-Flavor", "Google")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                peer.asked.set()

            def log_message(self, *args) -> None:
                pass

        super().__init__(Handler)


@pytest.fixture
def fresh_notice(monkeypatch):
    monkeypatch.setattr(preemption, "METADATA_POLL_S", 0.05)
    yield
    preemption._notice.clear()  # module state: one notice per trainer process
    preemption._noticed.clear()


@pytest.mark.parametrize(
    ("values", "what"),
    [
        ({"maintenance-event": "TERMINATE_ON_HOST_MAINTENANCE"}, "maintenance-event TERMINATE_ON_HOST_MAINTENANCE"),
        ({"preempted": "TRUE"}, "metadata preempted TRUE"),
    ],
)
def test_a_notice_from_the_metadata_server_sets_the_loops_stop_flag(monkeypatch, fresh_notice, values, what):
    with MetadataServer() as server:
        monkeypatch.setenv("GCE_METADATA_HOST", f"127.0.0.1:{server.port}")
        flags: list[bool] = []
        with preemption.notice_on_sigterm():
            preemption.on_notice(flags.append)
            assert server.asked.wait(10) and not preemption.noticed()  # polled, nothing announced yet
            server.values.update(values)
            for _ in range(200):
                if flags:  # notify() sets the notice, then calls back: wait for the callback, not the flag
                    break
                threading.Event().wait(0.05)
        assert flags == [True] and preemption.noticed()
        assert preemption._noticed[0][1] == what
        assert server.refused == 0
        err = preemption.Preempted(step=12, waited_s=preemption.waited_s())
        assert what in str(err) and "step 12" in str(err)


def test_no_metadata_server_is_quiet_off_google_cloud(monkeypatch, fresh_notice):
    with LoopbackServer(BaseHTTPRequestHandler) as closed:
        port = closed.port
    monkeypatch.setenv("GCE_METADATA_HOST", f"127.0.0.1:{port}")  # nothing listens there now
    with preemption.notice_on_sigterm():
        threading.Event().wait(0.5)
    assert not preemption.noticed()


def test_a_save_that_would_not_fit_the_grace_left_keeps_the_last_periodic_checkpoint(monkeypatch, fresh_notice):
    """The loop's answer to a notice (TrainLoop._answer_notice): a checkpoint at the step reached while the last
    save's time still fits in the grace left, else none, and the last periodic checkpoint is where the next
    trainer resumes; the error (the status record's) says which."""
    from mlm_tasks.training.loop import TrainLoop

    saved: list[int] = []
    loop = SimpleNamespace(
        end_s={"checkpoint": 8.0},  # the last save took 8 s
        save_checkpoint=saved.append,
        state=SimpleNamespace(checkpoints=SimpleNamespace(latest_checkpoint="/run/checkpoints/ckpt-250")),
    )
    monkeypatch.setattr(preemption, "_noticed", [(time.monotonic() - 25.0, "SIGTERM")])  # 25 s of 30 gone
    with pytest.raises(preemption.Preempted) as late:
        TrainLoop._answer_notice(loop, 317)
    assert saved == [] and late.value.step == 250
    assert "no time to save within the 30s grace: the last periodic checkpoint, step 250" in str(late.value)

    monkeypatch.setattr(preemption, "_noticed", [(time.monotonic() - 5.0, "SIGTERM")])  # 5 s gone: 8 s fit
    with pytest.raises(preemption.Preempted) as early:
        TrainLoop._answer_notice(loop, 317)
    assert saved == [317] and early.value.step == 317 and "checkpoint saved at step 317" in str(early.value)
