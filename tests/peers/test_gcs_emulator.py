"""The GCS emulator (peers/gcs_emulator.py) serves clients concurrently: a client that holds a
connection and sends nothing, or stops half way through its request, blocks no other client. (Its
first-writer-wins guarantee under concurrent writers: tests/mlm_tasks/test_storage.py, create_only race.)"""

import socket
import time

import pytest

from mlm_tasks import storage


@pytest.mark.parametrize(
    "sent",
    [
        b"",
        b"GET /storage/v1/b/mlm-test/o HTTP/1.1\r\nHost: x\r\n",
        b"POST /upload/storage/v1/b/mlm-test/o?uploadType=media&name=x HTTP/1.1\r\nContent-Length: 100\r\n\r\npartial",
    ],
)
def test_a_stalled_client_does_not_block_another_clients_read(gcs, gcs_root, sent):
    uri = f"{gcs_root}/record.json"
    storage.write_json(uri, {"step": 7})
    with socket.create_connection((gcs.host, gcs.port)) as stalled:
        stalled.sendall(sent)  # then nothing more, the connection held open
        time.sleep(0.2)
        began = time.monotonic()
        assert storage.read_json(uri) == {"step": 7}
        storage.write_json(uri, {"step": 8})
        assert storage.read_json(uri) == {"step": 8}
        assert time.monotonic() - began < 5
