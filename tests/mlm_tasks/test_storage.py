"""mlm_tasks.storage on a local folder and on gs:// (gcp-storage-emulator on loopback), same tests.

python -m pytest tests/mlm_tasks/test_storage.py -q
"""

from __future__ import annotations

import os
import threading
import time

import pytest

from mlm_tasks import storage
from mlm_tasks.paths import join


@pytest.fixture(params=["local", "gs"])
def root(request, tmp_path) -> str:
    if request.param == "local":
        return str(tmp_path / "out")
    return request.getfixturevalue("gcs_root")


def _all_names(root: str) -> list[str]:
    """Every file under root, relative, however deep: to catch stray temp files."""
    fs = storage.filesystem(root)
    base = storage.local_path(root) if storage.is_local(root) else root[len("gs://") :]
    return sorted(os.path.relpath(p, base) for p in fs.find(base))


def test_json_round_trip_and_missing(root):
    uri = join(root, "a", "b", "manifest.json")
    assert storage.read_json_if_exists(uri) is None
    assert not storage.exists(uri)
    storage.write_json(uri, {"records": 3, "splits": ["train"]})
    assert storage.exists(uri)
    assert storage.read_json(uri) == {"records": 3, "splits": ["train"]}
    with pytest.raises(FileNotFoundError):
        storage.read_bytes(join(root, "nope.bin"))


def test_overwrite_is_whole_and_leaves_no_temp_files(root):
    uri = join(root, "state.json")
    storage.write_json(uri, {"v": 1})
    storage.write_text(uri, '{"v": 2}')
    assert storage.read_json(uri) == {"v": 2}
    assert _all_names(root) == ["state.json"]


def test_failed_local_write_keeps_old_file_and_no_temp(tmp_path):
    uri = str(tmp_path / "x.bin")
    storage.write_bytes(uri, b"old")
    with pytest.raises(TypeError):
        storage.write_bytes(uri, "not bytes")  # fails inside the write, after the temp file exists
    assert storage.read_bytes(uri) == b"old"
    assert os.listdir(tmp_path) == ["x.bin"]


def test_create_only_first_writer_wins(root):
    uri = join(root, "tokenizer", "tokenizer.json")
    assert storage.create_only(uri, b"first") is True
    assert storage.create_only(uri, b"second") is False
    assert storage.read_bytes(uri) == b"first"
    assert _all_names(root) == ["tokenizer/tokenizer.json"]


def test_create_only_race_has_exactly_one_winner(root):
    uri = join(root, "race.txt")
    results: dict[int, bool] = {}

    def writer(i: int) -> None:
        results[i] = storage.create_only(uri, f"writer-{i}".encode())

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, won in results.items() if won]
    assert len(winners) == 1, results
    assert storage.read_bytes(uri) == f"writer-{winners[0]}".encode()


def test_the_scheme_is_the_one_dispatch():
    schemes = [storage.scheme(u) for u in ("gs://b/p", "/abs/p", "rel/p", "file:///abs/p")]
    assert schemes == ["gs", "file", "file", "file"]
    assert storage.bucket_and_name("gs://bucket/a/b.json") == ("bucket", "a/b.json")
    assert storage.local_path("file:///abs/p") == "/abs/p" and storage.is_local("rel/p")


def test_create_only_rejects_other_schemes():
    with pytest.raises(ValueError, match="local paths and gs://"):
        storage.create_only("memory://x/y", b"")


def test_listdir(root):
    assert storage.listdir(join(root, "shards")) == []
    for name in ("b.tfrecord", "a.tfrecord"):
        storage.write_bytes(join(root, "shards", "train", name), b"x")
    storage.write_bytes(join(root, "shards", "manifest.json"), b"{}")
    assert storage.listdir(join(root, "shards", "train")) == [
        join(root, "shards", "train", "a.tfrecord"),
        join(root, "shards", "train", "b.tfrecord"),
    ]
    top = storage.listdir(join(root, "shards"))
    assert join(root, "shards", "manifest.json") in top
    assert join(root, "shards", "train") in [u.rstrip("/") for u in top]


def test_upload_then_download_dir_round_trip(root, tmp_path):
    src = tmp_path / "model"
    (src / "sub").mkdir(parents=True)
    files = {"config.json": b'{"a": 1}', "tf_model.h5": os.urandom(3000), "sub/vocab.txt": b"x\ny\n"}
    for rel, data in files.items():
        (src / rel).write_bytes(data)
    uri = join(root, "runs", "r1", "model")
    storage.upload_dir(str(src), uri)
    assert sorted(_all_names(uri)) == sorted(files)

    got = storage.download_dir(uri, str(tmp_path / "downloaded"))
    for rel, data in files.items():
        with open(os.path.join(got, rel), "rb") as f:
            assert f.read() == data
    if storage.is_local(root):
        assert got == uri  # already local: no copy


def test_remove_file_and_tree(root):
    storage.write_bytes(join(root, "keep.txt"), b"k")
    storage.write_bytes(join(root, "ckpt", "a", "1.bin"), b"1")
    storage.write_bytes(join(root, "ckpt", "2.bin"), b"2")
    storage.remove(join(root, "keep.txt"))
    assert not storage.exists(join(root, "keep.txt"))
    storage.remove(join(root, "ckpt"), recursive=True)
    assert storage.listdir(join(root, "ckpt")) == []
    storage.remove(join(root, "never-existed"), recursive=True)  # no error
    assert _all_names(root) == []


def test_exists_sees_objects_written_by_another_client(gcs, gcs_root):
    """A poller must see a marker another process writes after it listed the folder."""
    storage.write_bytes(join(gcs_root, "shards", "manifest.json"), b"{}")
    assert storage.listdir(join(gcs_root, "shards")) == [join(gcs_root, "shards", "manifest.json")]
    name = join(gcs_root, "shards", "_SUCCESS")[len(f"gs://{gcs.bucket}/") :]
    gcs.client().bucket(gcs.bucket).blob(name).upload_from_string(b"")
    assert storage.exists(join(gcs_root, "shards", "_SUCCESS"))
    assert join(gcs_root, "shards", "_SUCCESS") in storage.listdir(join(gcs_root, "shards"))


@pytest.mark.parametrize("call", ["read_json", "write_json", "exists", "listdir", "create_only"])
def test_a_stalled_gcs_peer_fails_each_call_as_transient_within_its_deadline(call, monkeypatch):
    """A storage service that accepts the connection and never answers (a half-open connection): the
    call gives up at its deadline, cancelled, as a TransientError that names the setting."""
    from mlm_tasks.errors import TransientError
    from peers.stalled_peer import StalledPeer

    calls = {
        "read_json": storage.read_json,
        "write_json": lambda uri: storage.write_json(uri, {}),
        "exists": storage.exists,
        "listdir": storage.listdir,
        "create_only": lambda uri: storage.create_only(uri, b"x"),
    }
    storage.set_timeout(0.5)
    with StalledPeer() as peer:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", peer.endpoint)
        began = time.monotonic()
        with pytest.raises(TransientError, match=r"storage\.timeout_s=0\.5s") as err:
            calls[call]("gs://stalled-bucket/run/status.json")
        took = time.monotonic() - began
        assert peer.connections >= 1  # it got through to the peer, and waited on its answer
    assert took < storage.call_deadline() + 2, took  # the call's deadline (1.5 s), not gcsfs' 6 retries
    assert "The task retries" in str(err.value)


def test_the_deadline_is_bounded_and_reaches_tensorflow():
    from mlm_tasks.errors import ConfigError

    for bad in (0, -1, storage.MAX_TIMEOUT_S + 1):
        with pytest.raises(ConfigError, match="storage.timeout_s"):
            storage.set_timeout(bad)
    storage.set_timeout(20)
    assert storage.call_deadline() == 60 and storage.call_deadline(10 << 20) == 70
    assert storage.tensorflow_env() == {
        "GCS_REQUEST_CONNECTION_TIMEOUT_SECS": "20",
        "GCS_REQUEST_IDLE_TIMEOUT_SECS": "20",
        "GCS_METADATA_REQUEST_TIMEOUT_SECS": "60",
    }
