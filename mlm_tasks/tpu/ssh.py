"""SSH to worker 0 of a TPU VM: the login pinned to the host keys its node published, one command in a pty.

    connect = connector(lambda host: Login("mlm", "--ssh-key k", {"key_filename": k}), port, node=name,
                        published=tpu.published_keys(cfg.tpu, name))
    outcome = Session(connect, "10.128.0.7", on_line=print).run(command, secret=(TOKEN_PROMPT, token))

The one SSH path of the project; known_hosts is never read (docs/google-cloud.md#host-keys-on-first-contact).
"""

from __future__ import annotations

import base64
import binascii
import collections
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mlm_tasks.errors import AuthError, ConfigError, NoRetryError

log = logging.getLogger(__name__)

TAIL_LINES = 20
Published = Callable[[int], "dict[str, str]"]  # worker index -> {key type: base64 key}
Connect = Callable[..., Any]  # connect(host, worker=0) -> logged-in paramiko SSHClient


class HostKeyMismatch(AuthError):
    """The worker presented a host key its node did not publish: no retry can fix that."""


@dataclass
class Login:
    """Who logs in: `user`, where that login comes from (`source`, for messages), and the rest of
    paramiko's SSHClient.connect arguments (`options`: key_filename or pkey, timeouts, sock...)."""

    user: str
    source: str
    options: dict[str, Any] = field(default_factory=dict)
    keepalive_s: float = 0
    no_host_key_check: bool = False


def _keys(published: dict[str, str]) -> list[Any]:
    """paramiko keys of what the node published; types paramiko cannot parse are skipped."""
    import paramiko

    keys = []
    for key_type, blob in published.items():
        try:
            keys.append(paramiko.PKey.from_type_string(key_type, base64.b64decode(blob, validate=True)))
        except (paramiko.SSHException, paramiko.pkey.UnknownKeyType, binascii.Error, ValueError) as err:
            log.warning("Skipping published host key %s: paramiko cannot read it (%s).", key_type, err)
    return keys


def _login(login: Login, host: str, port: int, pinned: list[Any] | None) -> Any:
    """One SSH login; `pinned` None accepts any host key (the login opted out)."""
    import paramiko

    client = paramiko.SSHClient()
    if pinned is None:
        client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    else:
        entry = host if port == 22 else f"[{host}]:{port}"  # how paramiko looks the server up
        for key in pinned:
            client.get_host_keys().add(entry, key.get_name(), key)
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
    try:
        client.connect(hostname=host, port=port, username=login.user, **login.options)
    except BaseException:
        client.close()
        raise
    if login.keepalive_s:
        client.get_transport().set_keepalive(login.keepalive_s)
    return client


def _mismatch(node: str, worker: int, host: str, port: int, presented: Any, pinned: list[Any]) -> HostKeyMismatch:
    expected = ", ".join(f"{k.get_name()} {k.fingerprint}" for k in pinned)
    return HostKeyMismatch(
        f"The SSH host key of worker {worker} ({host}:{port}) does not match what node {node} published: it "
        f"presented {presented.get_name()} {presented.fingerprint}, the node published {expected}. A different "
        "machine answered at that IP (a new VM reusing it, or one impersonating the worker), or tpu.ssh_port "
        f"leads to another server. Check that {host} is still worker {worker} of {node} (`gcloud compute tpus "
        "tpu-vm describe`) and try again; do not turn the host key check off to get past this."
    )


def _fingerprints(keys: list[Any]) -> set[str]:
    return {f"{k.get_name()} {k.fingerprint}" for k in keys}


def _published_keys(published: Published, node: str, worker: int, deadline: float, poll_s: float) -> list[Any]:
    """The node's keys for `worker`, waiting (until deadline) for its guest agent to publish them."""
    while True:
        keys = _keys(published(worker))
        if keys:
            return keys
        if time.monotonic() + poll_s > deadline:
            raise RuntimeError(
                f"Node {node} has published no SSH host keys for worker {worker} (guest attributes "
                "hostkeys/ are empty): its guest agent may still be starting, or be disabled in the image. "
                "Retry in a few minutes; if they never appear, check that google-guest-agent runs "
                "on the VM (or turn the host key check off, trusting any machine at that IP)."
            )
        log.info(
            "Node %s has not published worker %d's SSH host keys yet: asking again in %.0fs.", node, worker, poll_s
        )
        time.sleep(poll_s)


def connector(
    login_for: Callable[[str], Login],
    port: int,
    *,
    node: str,
    published: Published | None,
    patience_s: float = 300.0,
    poll_s: float = 5.0,
) -> Connect:
    """connect(host, worker=0) -> a paramiko SSHClient logged in against the host keys the node published;
    refusals are retried for `patience_s`. `login_for(host)` is asked once per connect (a proxy is per host)."""
    import paramiko

    def connect(host: str, worker: int = 0) -> Any:
        deadline = time.monotonic() + patience_s
        login = login_for(host)
        if login.no_host_key_check:
            pinned = None
        elif published is None:
            raise ConfigError(
                f"No host keys to check {host} against: pass the node's published keys, or turn "
                f"the host key check off for {login.source} (anyone at that IP is then trusted)."
            )
        else:
            pinned = _published_keys(published, node, worker, deadline, poll_s)
        where, looked_again = f"{host}:{port} as {login.source}", False
        while True:
            try:
                return _login(login, host, port, pinned)
            except paramiko.BadHostKeyException as err:
                fresh: list[Any] = []
                if published and pinned and not looked_again:  # a first boot may replace the keys it published
                    wait_s, looked_again = min(poll_s, patience_s / 4), True
                    log.info(
                        "Worker %d of %s presented a host key it has not published: reading its keys again in %.0fs.",
                        worker,
                        node,
                        wait_s,
                    )
                    time.sleep(wait_s)
                    fresh = _keys(published(worker))
                if not fresh or _fingerprints(fresh) == _fingerprints(pinned or []):
                    raise _mismatch(node, worker, host, port, err.key, pinned or []) from err
                log.warning(
                    "Worker %d of %s presented a host key it had not published; it now publishes others "
                    "(a first boot replacing its keys): logging in against those.",
                    worker,
                    node,
                )
                pinned = fresh
                continue
            except paramiko.AuthenticationException as err:  # retried: the VM may not have our key yet
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"Cannot SSH to {where}: the worker refused the login for {patience_s:.0f}s ({err}). "
                        f"Check the connection's user and key: the login must match a key in the node's "
                        "ssh-keys metadata (or OS Login, with tpu.enable_oslogin)."
                    ) from err
            except (OSError, paramiko.SSHException) as err:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"Cannot SSH to {where}: no SSH session for {patience_s:.0f}s ({type(err).__name__}: "
                        f"{err}). Check that the firewall allows tcp:{port} from here and that sshd runs "
                        "on the worker."
                    ) from err
            time.sleep(max(0.1, min(5.0, deadline - time.monotonic())))

    return connect


PROBE_TIMEOUT_S = 10.0  # a READY node's worker whose SSH port does not answer this long fails the task at once


def unreachable(host: str, port: int, timeout_s: float) -> str | None:
    """Why `host:port` does not answer within timeout_s, or None when it does. A refusal (RST) is
    retried until then (sshd still starting); silence (a firewall dropping packets) ends it at once."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return f"{host}:{port}: connection refused for {timeout_s:g}s"
        try:
            with socket.create_connection((host, port), timeout=left):
                return None
        except ConnectionRefusedError:
            time.sleep(min(1.0, max(left, 0)))
        except TimeoutError:
            return f"{host}:{port}: no answer within {timeout_s:g}s (packets dropped: firewall?)"
        except OSError as err:  # no route, network unreachable
            return f"{host}:{port}: {err.strerror or err}"


@dataclass
class Outcome:
    """How the command ended on one worker, with its last lines."""

    host: str
    worker: int = 0
    exit_code: int | None = None  # None: did not finish (connection lost, or hung up by us)
    error: str | None = None
    fatal: bool = False  # a NoRetryError (a host-key mismatch, say): no retry can fix it
    tail: collections.deque = field(default_factory=lambda: collections.deque(maxlen=TAIL_LINES))

    def describe(self) -> str:
        what = f"exit code {self.exit_code}" if self.exit_code is not None else (self.error or "no exit code")
        lines = "\n    ".join(self.tail)
        return f"worker {self.worker} ({self.host}): {what}" + (f"; last lines:\n    {lines}" if lines else "")


class Session:
    """`command` on one worker in a pty; each output line goes to `on_line` as it comes.
    close(), from any thread, hangs up: sshd then sends SIGHUP to the remote command."""

    def __init__(
        self,
        connect: Connect,
        host: str,
        *,
        worker: int = 0,
        on_line: Callable[[str], None] | None = None,
        idle_timeout_s: float | None = None,
    ):
        self.connect = connect
        # No output this long (a half-open connection) ends a short command's session; None for long ones.
        self.idle_timeout_s = idle_timeout_s
        self.outcome = Outcome(host, worker)
        self.on_line = on_line or (lambda line: None)
        self._open: list[Any] = []  # the client, then its channel: what close() hangs up
        self._lock = threading.Lock()
        self._closed = False

    def _keep(self, thing: Any) -> None:
        with self._lock:
            self._open.append(thing)
            closed = self._closed
        if closed:  # hung up while this was being opened
            thing.close()
            raise EOFError("hung up before the command started")

    def run(
        self,
        command: str,
        env: dict[str, str] | None = None,
        secret: tuple[str, str] | None = None,
    ) -> Outcome:
        """Runs `command`; any failure is reported in the Outcome (the caller decides what it means).
        `secret` (prompt, value): when the command prints the line `prompt`, the value is sent on its stdin
        (bundle.remote_command's expect_token); the prompt is kept out of the tail."""
        out = self.outcome
        try:
            client = self.connect(out.host, out.worker)
            self._keep(client)
            channel = client.get_transport().open_session()
            self._keep(channel)
            if self.idle_timeout_s is not None:
                channel.settimeout(self.idle_timeout_s)
            channel.get_pty(width=200)  # a hang-up of the pty is what stops the remote command
            if env:
                # An sshd drops a name it does not accept silently: the remote line checks what it expects.
                channel.update_environment(env)
            channel.exec_command(command)
            for raw in channel.makefile("rb"):
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                if secret is not None and line == secret[0]:
                    channel.sendall((secret[1] + "\n").encode())
                    continue
                out.tail.append(line)
                self.on_line(line)
            code = channel.recv_exit_status()  # -1: hung up, killed by a signal, or connection lost
            if code == -1:
                out.error = "session ended without an exit status (hung up or killed by a signal)"
            else:
                out.exit_code = code
        except Exception as err:  # reported in the outcome; the caller fails on it
            out.error = f"{type(err).__name__}: {err}"
            out.fatal = isinstance(err, NoRetryError)
        finally:
            self.close()  # also on Ctrl-C or a signal: never leave the remote command running
        return out

    def close(self) -> None:
        """Hang up (idempotent)."""
        with self._lock:
            self._closed = True
            things, self._open = self._open[::-1], []
        for thing in things:
            thing.close()
