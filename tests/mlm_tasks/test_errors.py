"""The error taxonomy (mlm_tasks/errors.py) as each boundary keeps it: which failures are a person's to fix
(ConfigError, MissingArtifactError, AuthError: no retry, CLI exit 2) and which are worth a retry
(TransientError), against real peers on loopback: a GCS JSON API that answers a status, the GCS
emulator, the fake Hub."""

from __future__ import annotations

import json
import types
from http.server import BaseHTTPRequestHandler

import pytest

from mlm_tasks import errors, storage
from mlm_tasks.cli import main
from mlm_tasks.errors import AuthError, ConfigError, MissingArtifactError, NoRetryError, TransientError
from mlm_tasks.output_root import check_writable
from peers.loopback_http import LoopbackServer
from peers.run_artifacts import make_run
from peers.tiny_data import TINY_YAML


def test_the_no_retry_kinds_share_one_base_and_transient_is_not_one_of_them():
    for kind in (ConfigError, MissingArtifactError, AuthError):
        assert issubclass(kind, NoRetryError)
    assert not issubclass(TransientError, NoRetryError)
    assert issubclass(ConfigError, ValueError)  # pydantic validators may raise it
    # plugins/mlm_airflow/operators/remote_step.py reads a remote step's exit 2 as "no retry"
    assert errors.NO_RETRY_EXIT == 2


def test_errors_is_a_leaf():
    import ast

    with open(errors.__file__, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert imported == ["__future__"]


# -- check_writable on gs:// -----------------------------------------------------------------------
class AnsweringGcs(LoopbackServer):
    """A GCS JSON API that answers every request with one status and GCS's error body (as the real
    service words a 503 or a 403), counting the requests."""

    def __init__(self, status: int, message: str, reason: str):
        self.status, self.requests = status, 0
        body = json.dumps(
            {
                "error": {
                    "code": status,
                    "message": message,
                    "errors": [{"message": message, "domain": "global", "reason": reason}],
                }
            }
        )
        peer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _answer(self) -> None:
                peer.requests += 1
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                data = body.encode()
                self.send_response(peer.status)
                self.send_header("Content-Type", "application/json; charset=UTF-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = _answer

        super().__init__(Handler)


@pytest.fixture
def answering_gcs(monkeypatch):
    """Start an AnsweringGcs and point gcsfs at it. gcsfs retries a 5xx six times with backoff (about
    30 s): the backoff's sleeps are shortened, the tries are not."""
    import gcsfs
    import gcsfs.retry

    async def no_wait(_seconds):
        return None

    monkeypatch.setattr(gcsfs.retry, "asyncio", types.SimpleNamespace(sleep=no_wait))
    monkeypatch.setenv("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    started = []

    def start(status: int, message: str, reason: str) -> AnsweringGcs:
        peer = AnsweringGcs(status, message, reason).start()
        started.append(peer)
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{peer.port}")
        gcsfs.GCSFileSystem.clear_instance_cache()  # an instance made earlier would talk to another host
        return peer

    yield start
    gcsfs.GCSFileSystem.clear_instance_cache()
    for peer in started:
        peer.stop()


def test_a_503_while_probing_output_root_is_transient_after_gcsfs_retries(answering_gcs):
    gcs = answering_gcs(503, "We encountered an internal error. Please try again.", "backendError")
    with pytest.raises(
        TransientError,
        match=r"Cannot write to output_root gs://b/p now: the storage service "
        r"failed or did not answer .*The task retries",
    ):
        check_writable("gs://b/p")
    assert gcs.requests == 6  # gcsfs' own tries, then ours to make (the task's retry)


def test_a_403_while_probing_output_root_is_an_auth_error(answering_gcs):
    gcs = answering_gcs(
        403,
        "sa@p.iam.gserviceaccount.com does not have storage.objects.create access to the Google Cloud Storage object.",
        "forbidden",
    )
    with pytest.raises(
        AuthError,
        match=r"credentials were refused .*Forbidden.*storage\.objects\.create.*Give the "
        r"run's identity .* write access",
    ):
        check_writable("gs://b/p")
    assert gcs.requests == 1  # not retried by gcsfs either


def test_a_401_while_probing_output_root_is_an_auth_error(answering_gcs):
    answering_gcs(401, "Anonymous caller does not have storage.objects.create access.", "required")
    with pytest.raises(AuthError, match="credentials were refused"):
        check_writable("gs://b/p")


def test_a_missing_bucket_is_a_config_error(gcs):
    with pytest.raises(
        ConfigError,
        match=r"Cannot write to output_root gs://mlm-no-such-bucket-x/p "
        r"\(FileNotFoundError: .*\): check that the bucket exists",
    ):
        check_writable("gs://mlm-no-such-bucket-x/p")


def test_a_writable_bucket_passes_and_keeps_no_probe(gcs, gcs_root):
    check_writable(gcs_root)
    assert storage.listdir(f"{gcs_root}/_probes") == []


def test_a_local_folder_that_cannot_be_made_is_a_config_error(tmp_path):
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(ConfigError, match="Cannot write to output_root"):
        check_writable(str(tmp_path / "a-file" / "o"))


# -- the Hub: 401 vs 503 ---------------------------------------------------------------------------
def _publish(tmp_path, token):
    from mlm_tasks.config import build_config
    from mlm_tasks.paths import RunContext
    from mlm_tasks.steps.publish import publish

    run = make_run(str(tmp_path), "run-1")
    cfg = build_config({"output_root": str(tmp_path), "publish": {"enabled": True, "repo_id": "tester/m"}})
    return publish(cfg, RunContext(run.output_root, run.run_id), token=token)


def test_the_hub_rejecting_the_token_is_an_auth_error(tmp_path, fake_hub):
    with pytest.raises(AuthError, match=r"rejected the token \(401 Unauthorized\)"):
        _publish(tmp_path, "hf_not_the_token")


def test_a_hub_that_is_down_is_transient(tmp_path, fake_hub):
    fake_hub.outage(503)
    with pytest.raises(TransientError, match=r"(?s)The Hub failed while checking the token \(503\).*The task retries"):
        _publish(tmp_path, fake_hub.token)
    assert fake_hub.requests  # it was asked, and answered 503
    fake_hub.outage(None)
    assert _publish(tmp_path, fake_hub.token)["commit_oid"] == fake_hub.commits[-1].oid  # the retry's success


def test_another_refusal_by_the_hub_is_a_config_error(tmp_path, fake_hub):
    fake_hub.outage(404)
    with pytest.raises(
        ConfigError,
        match=r"(?s)The Hub refused the request while checking the token \(404\).*Check "
        r"publish\.repo_id",
    ):
        _publish(tmp_path, fake_hub.token)


# -- the CLI's exit status -------------------------------------------------------------------------
def _cli(tmp_path, *args):
    return main([args[0], "--config", str(TINY_YAML), "--set", f"output_root={tmp_path}", *args[1:]])


def test_the_cli_exits_2_for_every_no_retry_kind(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    assert _cli(tmp_path, "validate", "--set", "train.steps") == 2  # ConfigError: --set without =
    assert "error: --set 'train.steps': use KEY=VALUE" in capsys.readouterr().err
    assert _cli(tmp_path, "summary", "--data-fingerprint", "0123456789abcdef") == 2  # MissingArtifactError
    assert "No complete shard set for fingerprint 0123456789abcdef" in capsys.readouterr().err
    assert _cli(tmp_path, "publish", "--set", "publish.repo_id=o/m") == 2  # AuthError: no HF_TOKEN
    assert "set HF_TOKEN" in capsys.readouterr().err


def test_the_cli_lets_a_transient_error_out_exit_1(tmp_path, answering_gcs):
    """Not caught: Python exits 1 with the traceback, and the SSH runner retries the task."""
    answering_gcs(503, "Backend Error", "backendError")
    with pytest.raises(TransientError):
        _cli(tmp_path, "validate", "--set", "output_root=gs://bkt/p")


# -- the Airflow side: plugins/mlm_airflow/tasks/step_context.py --------------------------------------------
@pytest.mark.parametrize("kind", [ConfigError, MissingArtifactError, AuthError])
def test_task_errors_fail_every_no_retry_kind_at_once(kind):
    from airflow.sdk.exceptions import AirflowFailException

    from mlm_airflow.tasks.step_context import bad_input_fails_fast

    with pytest.raises(AirflowFailException, match="the message says what to do") as caught, bad_input_fails_fast():
        raise kind("the message says what to do")
    assert caught.value.__cause__ is None  # the step's own message, not a traceback of the glue


@pytest.mark.parametrize("error", [TransientError("503 from the service"), OSError("disk hiccup")])
def test_task_errors_leave_transient_and_unforeseen_errors_to_retries(error):
    from mlm_airflow.tasks.step_context import bad_input_fails_fast

    with pytest.raises(type(error)), bad_input_fails_fast():
        raise error


def test_hub_connection_fails_fast_only_when_the_connection_is_missing(monkeypatch):
    """A lookup that failed (the secrets backend down) is raised as it is and so retried; a missing
    connection or an authoritative deny fail the task at once."""
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowFailException, AirflowSecretsBackendAccessDenied

    from mlm_airflow.connections import hub_credentials

    with pytest.raises(AirflowFailException, match="No Airflow connection 'hf_absent'"):
        hub_credentials("hf_absent")

    def backend(error):
        def get_connection(conn_id):
            raise error

        return get_connection

    monkeypatch.setattr(BaseHook, "get_connection", backend(TimeoutError("secrets backend timed out")))
    with pytest.raises(TimeoutError, match="secrets backend timed out"):
        hub_credentials("hf_any")
    monkeypatch.setattr(BaseHook, "get_connection", backend(AirflowSecretsBackendAccessDenied("denied")))
    with pytest.raises(AirflowFailException, match="'hf_any' may not be read by this task"):
        hub_credentials("hf_any")
