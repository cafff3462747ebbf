"""TensorFlow's own gs:// client reads and writes the GCS emulator through the TLS proxy.

    python -m pytest tests/peers/test_tf_gcs_proxy.py -q

The TFRecord file is framed here in pure Python and uploaded with mlm_tasks.storage (gcsfs);
TensorFlow runs in a subprocess because it reads the proxy/CA/token variables when it loads.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys

import google_crc32c

from mlm_tasks import storage
from mlm_tasks.paths import join

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TF_SCRIPT = r"""
import json, sys
import tensorflow as tf
shard, pattern, missing, written = sys.argv[1:5]
records = [r.numpy().decode() for r in tf.data.TFRecordDataset(shard)]
with tf.io.gfile.GFile(written, "w") as f:
    f.write("written by tensorflow")
print("RESULT " + json.dumps({"exists": tf.io.gfile.exists(shard), "missing": tf.io.gfile.exists(missing),
                              "glob": tf.io.gfile.glob(pattern), "records": records}))
"""


def _masked_crc(data: bytes) -> bytes:
    crc = google_crc32c.value(data)
    return struct.pack("<I", (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF)


def tfrecord_bytes(records: list[bytes]) -> bytes:
    """The TFRecord framing: length, crc(length), data, crc(data)."""
    out = []
    for data in records:
        length = struct.pack("<Q", len(data))
        out += [length, _masked_crc(length), data, _masked_crc(data)]
    return b"".join(out)


def test_tensorflow_reads_and_writes_gs_through_proxy(gcs_root, tf_gcs_env, tls_gcs_proxy):
    # ~1.3 MB with 1 MB read blocks: TF must issue more than one ranged read to get it all.
    records = [f"{i:05d}".encode() + b"x" * 4500 for i in range(300)]
    shards = join(gcs_root, "shards", "train")
    shard = join(shards, "shard-00000-of-00002.tfrecord")
    storage.write_bytes(shard, tfrecord_bytes(records))
    storage.write_bytes(join(shards, "shard-00001-of-00002.tfrecord"), tfrecord_bytes([b"other"]))
    written = join(gcs_root, "from_tf", "note.txt")

    env = {**os.environ, **tf_gcs_env, "GCS_READ_CACHE_BLOCK_SIZE_MB": "1", "PYTHONPATH": REPO}
    seen = len(tls_gcs_proxy.server.log), len(tls_gcs_proxy.server.refused)  # the proxy is per session
    proc = subprocess.run(
        [sys.executable, "-c", TF_SCRIPT, shard, join(shards, "*.tfrecord"), join(shards, "nope.tfrecord"), written],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"TF subprocess failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    result = json.loads(lines[-1][len("RESULT ") :])

    assert result["records"] == [r.decode() for r in records]
    assert result["exists"] is True and result["missing"] is False
    assert result["glob"] == [shard, join(shards, "shard-00001-of-00002.tfrecord")]
    assert storage.read_text(written) == "written by tensorflow"

    log, refused = tls_gcs_proxy.server.log[seen[0] :], tls_gcs_proxy.server.refused[seen[1] :]
    assert not refused, f"TF asked for hosts the proxy does not serve: {refused}"
    ranged = [entry for entry in log if entry[1] == "storage.googleapis.com" and entry[4]]
    assert len(ranged) >= 2 and any(not r[4].startswith("bytes=0-") for r in ranged), log
    errors = [entry for entry in log if entry[3] >= 400 and "nope" not in entry[2]]
    assert not errors, errors
