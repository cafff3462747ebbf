"""`[core] hostname_callable` of the loopback Celery workers: the name the test gave the worker.

Task instances record the hostname of the machine that ran them; two workers on one machine would
record the same one. On real machines the default (the FQDN) already tells them apart, so only the
test stack sets AIRFLOW__CORE__HOSTNAME_CALLABLE=peers.worker_hostname.hostname (airflow_stack.WORKER_LOCAL_ENV).
"""

from __future__ import annotations

import os
import socket


def hostname() -> str:
    return os.environ.get("MLM_TEST_WORKER_HOSTNAME") or socket.getfqdn()
