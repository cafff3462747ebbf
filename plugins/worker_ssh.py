"""The login to a TPU VM worker, read from the Airflow SSH connection; the SSH itself is mlm_tasks/tpu/ssh.py.

    connect = ssh_connect("tpu_ssh", 22, node=name,
                          published=tpu.published_keys(cfg.tpu, name, api=api))
    client = connect("10.128.0.7", 0)   # a logged-in paramiko SSHClient for worker 0

The login (user, `key_file` or `private_key`, password, timeouts, a ProxyCommand from ~/.ssh/config)
is read from the connection with the SSH provider's SSHHook; the worker must present one of the host
keys its node published (mlm_tasks.tpu.ssh). A `host_key` extra is not used (every VM has keys of its
own), nor ~/.ssh/known_hosts. `no_host_key_check: true` in the extra accepts any host key, with a
warning: anyone answering at that IP is then believed. A failure that no retry can fix (a host-key
mismatch, a ConfigError) fails the task without retries (plugins/remote_step.py).
"""
from __future__ import annotations

import logging
from typing import Any

from mlm_tasks.tpu import ssh

log = logging.getLogger(__name__)
_warned: set[tuple[str, str]] = set()  # (connection, host) already warned about in this process


def login(conn_id: str, host: str, port: int) -> ssh.Login:
    """The connection's login for `host`, as paramiko takes it."""
    from airflow.providers.ssh.hooks.ssh import SSHHook

    hook = SSHHook(ssh_conn_id=conn_id, remote_host=host, port=port, conn_timeout=30)
    options: dict[str, Any] = {
        "password": hook.password or None, "pkey": hook.pkey, "key_filename": hook.key_file,
        "look_for_keys": hook.look_for_keys, "timeout": hook.conn_timeout, "banner_timeout": hook.banner_timeout,
        "auth_timeout": hook.auth_timeout, "compress": hook.compress, "sock": hook.host_proxy,
        "disabled_algorithms": hook.disabled_algorithms}
    return ssh.Login(hook.username, f"connection {conn_id!r}", options, keepalive_s=hook.keepalive_interval or 0,
                     no_host_key_check=bool(hook.no_host_key_check))


def ssh_connect(conn_id: str, port: int, patience_s: float = 300.0, *, node: str = "",
                published: ssh.Published | None = None, poll_s: float = 5.0) -> ssh.Connect:
    """connect(host, worker=0) -> logged-in paramiko SSHClient, as connection `conn_id`."""

    def login_for(host: str) -> ssh.Login:
        found = login(conn_id, host, port)
        if found.no_host_key_check and (conn_id, host) not in _warned:
            _warned.add((conn_id, host))  # once: a trigger polling every 30 s would repeat it in every poll
            log.warning("Connection %r sets no_host_key_check=true: the host key of %s is not checked, so any "
                        "machine answering there is trusted. Remove it to pin the keys node %s published.",
                        conn_id, host, node or "(unknown)")
        return found

    return ssh.connector(login_for, port, node=node, published=published, patience_s=patience_s, poll_s=poll_s)
