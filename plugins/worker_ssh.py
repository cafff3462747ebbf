"""Log in to a TPU VM worker over SSH as the Airflow SSH connection, accepting only the host keys the node published.

    connect = ssh_connect("tpu_ssh", 22, node=name,
                          published=lambda worker: tpu.host_keys(cfg.tpu, name, worker, api=api))
    client = connect("10.128.0.7", 0)   # a logged-in paramiko SSHClient for worker 0

A TPU VM's guest agent publishes its sshd host keys as guest attributes (`hostkeys/`), which is what
`gcloud compute tpus tpu-vm ssh` pins; here too the worker must present one of them. ~/.ssh/known_hosts
is never read: a new VM often gets the IP of an old one, whose entry would refuse it. The login (user,
`key_file` or `private_key`, password) is read from the connection with the SSH provider's SSHHook; a
`host_key` extra is not used (every VM has keys of its own). `no_host_key_check: true` in the extra
accepts any host key, with a warning: anyone answering at that IP is then believed.

A fresh VM refuses SSH, or our key, for a minute or two after READY (sshd starting, ssh-keys metadata
being applied) and publishes its host keys only once its guest agent runs, so those are retried for
`patience_s`. A host key that does not match is not retried (HostKeyMismatch, an AirflowFailException):
a retry reaches the same machine. Each failure names its kind: host key, login (user and key), or no
SSH answer (firewall).
"""
from __future__ import annotations

import base64
import binascii
import logging
import time
from collections.abc import Callable
from typing import Any

from airflow.sdk.exceptions import AirflowFailException

log = logging.getLogger(__name__)

Published = Callable[[int], "dict[str, str]"]   # worker index -> {key type: base64 key}


class HostKeyMismatch(AirflowFailException):
    """The worker presented a host key its node did not publish: no retry can fix that."""


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


def _login(hook: Any, host: str, port: int, pinned: list[Any] | None) -> Any:
    """One SSH login with the hook's settings; `pinned` None accepts any host key."""
    import paramiko

    client = paramiko.SSHClient()
    if pinned is None:
        client.set_missing_host_key_policy(paramiko.AutoAddPolicy())  # the connection opted out
    else:
        entry = host if port == 22 else f"[{host}]:{port}"  # how paramiko looks the server up
        for key in pinned:
            client.get_host_keys().add(entry, key.get_name(), key)
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
    try:
        client.connect(hostname=host, port=port, username=hook.username, password=hook.password or None,
                       pkey=hook.pkey, key_filename=hook.key_file, look_for_keys=hook.look_for_keys,
                       timeout=hook.conn_timeout, banner_timeout=hook.banner_timeout,
                       auth_timeout=hook.auth_timeout, compress=hook.compress, sock=hook.host_proxy,
                       disabled_algorithms=hook.disabled_algorithms)
    except BaseException:
        client.close()
        raise
    if hook.keepalive_interval:
        client.get_transport().set_keepalive(hook.keepalive_interval)
    return client


def _mismatch(node: str, worker: int, host: str, port: int, presented: Any, pinned: list[Any]) -> HostKeyMismatch:
    expected = ", ".join(f"{k.get_name()} {k.fingerprint}" for k in pinned)
    return HostKeyMismatch(
        f"The SSH host key of worker {worker} ({host}:{port}) does not match what node {node} published: it "
        f"presented {presented.get_name()} {presented.fingerprint}, the node published {expected}. A different "
        "machine answered at that IP (a new VM reusing it, or one impersonating the worker), or tpu.ssh_port "
        f"leads to another server. Check that {host} is still worker {worker} of {node} (`gcloud compute tpus "
        "tpu-vm describe`) and clear the task; do not set no_host_key_check to get past this.")


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
                "Retry the task in a few minutes; if they never appear, check that google-guest-agent runs "
                "on the VM (or set no_host_key_check=true in the SSH connection's extra, trusting any machine "
                "at that IP).")
        log.info("Node %s has not published worker %d's SSH host keys yet: asking again in %.0fs.",
                 node, worker, poll_s)
        time.sleep(poll_s)


def ssh_connect(conn_id: str, port: int, patience_s: float = 300.0, *, node: str = "",
                published: Published | None = None, poll_s: float = 5.0) -> Callable[..., Any]:
    """connect(host, worker=0) -> logged-in paramiko SSHClient; see the module docstring."""

    import paramiko
    from airflow.providers.ssh.hooks.ssh import SSHHook

    def connect(host: str, worker: int = 0) -> Any:
        deadline = time.monotonic() + patience_s
        hook = SSHHook(ssh_conn_id=conn_id, remote_host=host, port=port, conn_timeout=30)
        if hook.no_host_key_check:
            log.warning("Connection %r sets no_host_key_check=true: worker %d's host key is not checked, so "
                        "any machine answering at %s is trusted. Remove it to pin the keys node %s published.",
                        conn_id, worker, host, node or "(unknown)")
            pinned = None
        elif published is None:
            raise AirflowFailException(
                f"No host keys to check {host} against: pass the node's published keys, or set "
                f"no_host_key_check=true in connection {conn_id!r}'s extra (anyone at that IP is then trusted).")
        else:
            pinned = _published_keys(published, node, worker, deadline, poll_s)
        where = f"{host}:{port} as connection {conn_id!r}"
        while True:
            try:
                return _login(hook, host, port, pinned)
            except paramiko.BadHostKeyException as err:
                raise _mismatch(node, worker, host, port, err.key, pinned or []) from err
            except paramiko.AuthenticationException as err:  # retried: the VM may not have our key yet
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"Cannot SSH to {where}: the worker refused the login for {patience_s:.0f}s ({err}). "
                        f"Check the connection's user and key: the login must match a key in the node's "
                        "ssh-keys metadata (or OS Login, with tpu.enable_oslogin).") from err
            except (OSError, paramiko.SSHException) as err:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"Cannot SSH to {where}: no SSH session for {patience_s:.0f}s ({type(err).__name__}: "
                        f"{err}). Check that the firewall allows tcp:{port} from Airflow and that sshd runs "
                        "on the worker.") from err
            time.sleep(5)

    return connect
