"""A small fake of the Hugging Face Hub HTTP API on 127.0.0.1, driven by the real huggingface_hub client.

Covers what `HfApi.create_repo`, `create_branch`, `list_repo_refs`, `upload_folder`/`create_commit`
(regular and LFS files, to any branch), `repo_info`/`model_info` and `hf_hub_download` call in
huggingface_hub 0.36 (and what transformers' `from_pretrained(repo, revision=...)` reads through it, in
4.57 and in 5.x with huggingface_hub 2.x): whoami-v2, repos/create, branch creation (409 when it exists,
404 for an unknown starting point), refs, validate-yaml, preupload, the LFS batch API with basic PUT
transfers, commit (NDJSON) to a branch, model info (at a revision too), the tree listing at a revision
(404 for a missing folder), and file downloads (`HEAD`/`GET /<repo>/resolve/<rev>/<file>`, with the
X-Repo-Commit, ETag and X-Linked-* headers the client checks). Every commit's files are kept, so a
revision (a branch, or a commit oid) downloads what it held; an unknown one is RevisionNotFound (a
commit or preupload to a branch that does not exist too), a missing file EntryNotFound. It checks the
bearer token like the Hub does (a private repo is not found without it) and records every commit for
tests to assert on. Leniency left: no redirect to a CDN for LFS files (served directly, with the headers
the redirect would carry), no Xet storage (the clients fall back to plain downloads), no Range requests,
no tags, no check of branch names against git's ref rules, no parentCommit check.
`hub.stall()` makes it a hung Hub: every request is taken in and left unanswered (the connection
open, never answered) until `hub.unstall()` or stop, so a client without a timeout waits for ever.
`hub.outage(503)` makes it a Hub that is down: every request is answered with that status (in the Hub's
error body and headers) until `hub.outage(None)`.

    hub = FakeHub(token="hf_test", user="alice").start()
    api = HfApi(endpoint=hub.url, token="hf_test")
    ...
    hub.commits[-1].files  -> {"config.json": b"...", ...}
    hub.stop()

Tests use the `fake_hub` fixture (exported by tests/conftest.py).
Run on its own for manual poking: `python tests/peers/fake_hub.py` (prints URL and token).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

import pytest
import yaml

# What the real Hub keeps in LFS by default (.gitattributes of a new repo), plus anything over 10 MB.
LFS_SUFFIXES = (
    ".h5",
    ".bin",
    ".safetensors",
    ".ckpt",
    ".msgpack",
    ".pt",
    ".pth",
    ".onnx",
    ".tflite",
    ".npy",
    ".npz",
    ".zip",
    ".gz",
    ".tar",
)
LFS_MIN_SIZE = 10 * 1024 * 1024
INVALID_CREDENTIALS = "Invalid credentials in Authorization header"


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Commit:
    repo_id: str
    revision: str
    oid: str
    message: str
    description: str
    files: dict[str, bytes]  # added or replaced in this commit
    lfs_paths: set[str]  # which of `files` arrived through LFS
    deleted: list[str]


EMPTY_COMMIT = "0" * 40  # a new repo's main: no files


@dataclass
class Repo:
    repo_id: str
    private: bool
    repo_type: str = "model"
    history: dict[str, dict[str, bytes]] = field(default_factory=lambda: {EMPTY_COMMIT: {}})  # oid -> its files
    branches: dict[str, str] = field(default_factory=lambda: {"main": EMPTY_COMMIT})  # name -> head commit oid

    sha = property(lambda self: self.branches["main"])
    files = property(lambda self: self.history[self.sha])

    def at(self, revision: str) -> tuple[str, dict[str, bytes]] | None:
        """(commit oid, files) of a revision: a branch, or a commit of this repo; None if it has no such one."""
        oid = self.branches.get(revision, revision)
        return (oid, self.history[oid]) if oid in self.history else None


def is_lfs(path: str, data: bytes) -> bool:
    return path.endswith(LFS_SUFFIXES) or len(data) >= LFS_MIN_SIZE


class FakeHub:
    def __init__(self, token: str = "hf_fake_write_token", user: str = "tester", orgs: tuple[str, ...] = ("test-org",)):
        self.token, self.user, self.orgs = token, user, tuple(orgs)
        self.repos: dict[str, Repo] = {}
        self.commits: list[Commit] = []
        self.lfs_objects: dict[str, bytes] = {}
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Authorization header)
        # Tests hold commits (clear `commits_released`) to prove a caller does not wait on uploads;
        # `commit_arrived` tells them a commit request is in flight.
        self.commits_released = threading.Event()
        self.commits_released.set()
        self.commit_arrived = threading.Event()
        self.answering = threading.Event()  # cleared by stall(): requests wait, unanswered
        self.outage_status: int | None = None  # set by outage(): every request gets this status
        self.answering.set()
        self.lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> FakeHub:
        hub = self

        class Handler(_Handler):
            fake = hub

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, args=(0.05,), name="fake-hub", daemon=True).start()
        return self

    def stall(self) -> None:
        """From now on, leave every request unanswered (a hung Hub) until unstall() or stop()."""
        self.answering.clear()

    def outage(self, status: int | None) -> None:
        self.outage_status = status

    def unstall(self) -> None:
        self.answering.set()

    def stop(self) -> None:
        self.commits_released.set()  # never leave a handler thread parked on a held commit
        self.answering.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    @property
    def url(self) -> str:
        assert self._server is not None, "FakeHub.start() first"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- assertions helpers ----------------------------------------------------------------------------
    def commits_to(self, repo_id: str) -> list[Commit]:
        return [c for c in self.commits if c.repo_id == repo_id]

    def add_repo(self, repo_id: str, private: bool = False) -> Repo:
        with self.lock:
            return self.repos.setdefault(repo_id, Repo(repo_id, private))


class _Handler(BaseHTTPRequestHandler):
    fake: FakeHub
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # keep pytest output clean
        pass

    # -- plumbing ------------------------------------------------------------------------------------
    def _send(self, status: int, body: object = None, headers: dict[str, str] | None = None) -> None:
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":  # a HEAD answer has the headers of the GET, never its body
            self.wfile.write(data)

    def _error(self, status: int, message: str, code: str | None = None) -> None:
        headers = {"X-Error-Message": message}
        if code:
            headers["X-Error-Code"] = code
        self._send(status, {"error": message}, headers)

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _authorized(self, required: bool = True) -> bool:
        """True if the bearer token is the fake's; otherwise answers 401 the way the Hub does."""
        header = self.headers.get("Authorization")
        if header is None and not required:
            return True
        if header != f"Bearer {self.fake.token}":
            self._error(401, INVALID_CREDENTIALS)
            return False
        return True

    def _dispatch(self, method: str) -> None:
        path = self.path.split("?", 1)[0]
        with self.fake.lock:
            self.fake.requests.append((method, path, self.headers.get("Authorization")))
        if not self.fake.answering.is_set():  # stalled: this request never gets an answer
            self.fake.answering.wait(timeout=120)
            self.close_connection = True
            return
        if self.fake.outage_status is not None:
            self._body()
            status = self.fake.outage_status
            return self._error(status, f"{HTTPStatus(status).phrase} (FakeHub.outage({status}))")
        for pattern, name in _ROUTES.get(method, []):
            match = re.fullmatch(pattern, path)
            if match:
                return getattr(self, name)(*match.groups())
        self._body()
        self._error(404, f"FakeHub has no route for {method} {path}")

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def _repo_or_404(self, repo_id: str) -> Repo | None:
        repo = self.fake.repos.get(repo_id)
        if repo is None:
            self._error(404, "Repository not found", code="RepoNotFound")
        return repo

    # -- endpoints -------------------------------------------------------------------------------------
    def whoami(self) -> None:
        if self._authorized():
            self._send(
                200,
                {
                    "type": "user",
                    "name": self.fake.user,
                    "fullname": self.fake.user,
                    "orgs": [{"name": o, "type": "org"} for o in self.fake.orgs],
                    "auth": {"type": "access_token", "accessToken": {"displayName": "fake", "role": "write"}},
                },
            )

    def create_repo(self) -> None:
        payload = json.loads(self._body() or b"{}")
        if not self._authorized():
            return
        namespace = payload.get("organization") or self.fake.user
        repo_id = f"{namespace}/{payload['name']}"
        if namespace not in (self.fake.user, *self.fake.orgs):
            return self._error(403, f"You don't have the rights to create a model under the namespace {namespace!r}")
        url = f"{self.fake.url}/{repo_id}"
        with self.fake.lock:
            if repo_id in self.fake.repos:
                return self._send(409, {"error": "You already created this model repo", "url": url})
            self.fake.repos[repo_id] = Repo(
                repo_id, bool(payload.get("private", False)), payload.get("type") or "model"
            )
        self._send(200, {"url": url, "name": repo_id, "id": repo_id})

    def validate_yaml(self) -> None:
        payload = json.loads(self._body() or b"{}")
        if not self._authorized(required=False):
            return
        match = re.match(r"^---\n(.*?)\n---", payload.get("content", ""), re.S)
        try:
            meta = yaml.safe_load(match.group(1)) if match else None
        except yaml.YAMLError as err:
            return self._send(400, {"errors": [{"message": f"Invalid YAML: {err}"}]})
        warnings = [] if meta else [{"message": "Empty or missing yaml metadata in repo card"}]
        self._send(200, {"errors": [], "warnings": warnings})

    def preupload(self, repo_id: str, rev: str) -> None:
        payload = json.loads(self._body() or b"{}")
        if not self._authorized():
            return
        repo = self._repo_or_404(repo_id)
        if repo is None:
            return
        found = repo.at(unquote(rev))
        if found is None:
            return self._error(404, f"Invalid rev id: {unquote(rev)}", code="RevisionNotFound")
        files = []
        for f in payload.get("files", []):
            lfs = f["path"].endswith(LFS_SUFFIXES) or f["size"] >= LFS_MIN_SIZE
            old = found[1].get(f["path"])
            oid = None
            if old is not None:
                oid = hashlib.sha256(old).hexdigest() if lfs else git_blob_sha1(old)
            files.append(
                {"path": f["path"], "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False, "oid": oid}
            )
        self._send(200, {"files": files, "commitOid": found[0]})

    def lfs_batch(self, repo_id: str) -> None:
        payload = json.loads(self._body() or b"{}")
        if not self._authorized():
            return
        if self._repo_or_404(repo_id) is None:
            return
        objects = []
        for obj in payload.get("objects", []):
            entry = {"oid": obj["oid"], "size": obj["size"]}
            if obj["oid"] not in self.fake.lfs_objects:
                # Like S3 presigned URLs, the upload URL itself carries the permission (no token sent).
                entry["actions"] = {"upload": {"href": f"{self.fake.url}/_lfs/{obj['oid']}"}}
            objects.append(entry)
        self._send(200, {"transfer": "basic", "objects": objects})

    def lfs_put(self, oid: str) -> None:
        data = self._body()
        if hashlib.sha256(data).hexdigest() != oid:
            return self._error(400, "LFS object does not match its sha256")
        with self.fake.lock:
            self.fake.lfs_objects[oid] = data
        self._send(200)

    def commit(self, repo_id: str, revision: str) -> None:
        lines = [json.loads(line) for line in self._body().splitlines() if line.strip()]
        self.fake.commit_arrived.set()
        self.fake.commits_released.wait(timeout=60)
        if not self._authorized():
            return
        repo = self._repo_or_404(repo_id)
        if repo is None:
            return
        header = next((item["value"] for item in lines if item["key"] == "header"), None)
        if header is None:
            return self._error(400, "Commit payload has no header line")
        files, lfs_paths, deleted = {}, set(), []
        for item in lines:
            key, value = item["key"], item["value"]
            if key == "file":
                files[value["path"]] = base64.b64decode(value["content"])
            elif key == "lfsFile":
                if value["oid"] not in self.fake.lfs_objects:
                    return self._error(422, f"LFS object {value['oid']} of {value['path']} was never uploaded")
                files[value["path"]] = self.fake.lfs_objects[value["oid"]]
                lfs_paths.add(value["path"])
            elif key in ("deletedFile", "deletedFolder"):
                deleted.append(value["path"])
        branch = unquote(revision)
        with self.fake.lock:
            if branch not in repo.branches:  # a commit goes onto a branch; create_branch makes one
                return self._error(404, f"Invalid rev id: {branch}", code="RevisionNotFound")
            parent = repo.branches[branch]
            digest = hashlib.sha1(parent.encode() + header["summary"].encode())
            for path in sorted(files):
                digest.update(path.encode() + b"\0" + files[path])
            oid = digest.hexdigest()
            tree = dict(repo.history[parent])
            for path in deleted:
                folder = path.rstrip("/") + "/"
                tree = {p: b for p, b in tree.items() if p != path and not p.startswith(folder)}
            repo.history[oid] = {**tree, **files}
            repo.branches[branch] = oid
            self.fake.commits.append(
                Commit(
                    repo_id, branch, oid, header["summary"], header.get("description", ""), files, lfs_paths, deleted
                )
            )
        self._send(
            200,
            {
                "success": True,
                "commitOid": oid,
                "pullRequestUrl": None,
                "commitUrl": f"{self.fake.url}/{repo_id}/commit/{oid}",
            },
        )

    def create_branch(self, repo_id: str, branch: str) -> None:
        """POST /api/models/<repo>/branch/<name> {"startingPoint": rev}: from that revision, else main's head."""
        payload = json.loads(self._body() or b"{}")
        if not self._authorized():
            return
        repo = self._repo_or_404(repo_id)
        if repo is None:
            return
        branch, start = unquote(branch), payload.get("startingPoint") or "main"
        with self.fake.lock:
            found = repo.at(start)
            if found is None:
                return self._error(404, f"Invalid rev id: {start}", code="RevisionNotFound")
            if branch in repo.branches:
                return self._error(409, f"Reference already exists: refs/heads/{branch}")
            repo.branches[branch] = found[0]
        self._send(200)

    def refs(self, repo_id: str) -> None:
        repo = self._readable_repo(repo_id)
        if repo is not None:
            branches = [{"name": n, "ref": f"refs/heads/{n}", "targetCommit": oid} for n, oid in repo.branches.items()]
            self._send(200, {"branches": branches, "converts": [], "tags": []})

    def _readable_repo(self, repo_id: str) -> Repo | None:
        """The repo if this request may read it; otherwise answers 401 (bad token) or 404 (absent, or
        private without a token), as the Hub does."""
        if not self._authorized(required=False):
            return None
        repo = self.fake.repos.get(repo_id)
        if repo is None or (repo.private and self.headers.get("Authorization") is None):
            self._error(404, "Repository not found", code="RepoNotFound")
            return None
        return repo

    def repo_info(self, repo_id: str, rev: str | None = None) -> None:
        repo = self._readable_repo(repo_id)
        if repo is None:
            return
        found = repo.at(unquote(rev or "main"))
        if found is None:
            return self._error(404, f"Invalid rev id: {rev}", code="RevisionNotFound")
        sha, files = found
        self._send(
            200,
            {
                "id": repo_id,
                "modelId": repo_id,
                "private": repo.private,
                "sha": sha,
                "author": repo_id.split("/")[0],
                "tags": [],
                "downloads": 0,
                "likes": 0,
                "siblings": [{"rfilename": p} for p in sorted(files)],
            },
        )

    def resolve(self, repo_id: str, rev: str, path: str) -> None:
        """A file at a revision (GET), or only its headers (HEAD): what hf_hub_download reads."""
        repo = self._readable_repo(repo_id)
        if repo is None:
            return
        found = repo.at(unquote(rev))
        if found is None:
            return self._error(404, f"Invalid rev id: {rev}", code="RevisionNotFound")
        sha, files = found
        path = unquote(path)
        if path not in files:
            return self._error(404, f"Entry not found: {path}", code="EntryNotFound")
        data = files[path]
        lfs = is_lfs(path, data)
        etag = hashlib.sha256(data).hexdigest() if lfs else git_blob_sha1(data)
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("X-Repo-Commit", sha)
        self.send_header("ETag", f'"{etag}"')
        if lfs:  # what the Hub's redirect to its CDN carries for an LFS file
            self.send_header("X-Linked-Etag", f'"{etag}"')
            self.send_header("X-Linked-Size", str(len(data)))
        self.end_headers()
        if self.command == "GET":
            self.wfile.write(data)

    def tree(self, repo_id: str, rev: str, prefix: str | None = None) -> None:
        """The files under `prefix` at a revision, recursively (what `list_repo_files`, hence upload_folder's
        delete_patterns, uses; a non-recursive listing gets the same, folders left out). A folder with no
        files is a 404, as on the Hub."""
        repo = self._readable_repo(repo_id)
        if repo is None:
            return
        found = repo.at(unquote(rev))
        if found is None:
            return self._error(404, f"Invalid rev id: {unquote(rev)}", code="RevisionNotFound")
        files = found[1]
        prefix = unquote(prefix).strip("/") + "/" if prefix else ""
        if prefix and not any(p.startswith(prefix) for p in files):
            return self._error(404, f"Entry not found: {prefix}", code="EntryNotFound")
        entries = []
        for path in sorted(p for p in files if p.startswith(prefix)):
            data = files[path]
            entry = {"type": "file", "path": path, "size": len(data), "oid": git_blob_sha1(data)}
            if is_lfs(path, data):
                entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 130}
            entries.append(entry)
        self._send(200, entries)


_REPO = r"([^/]+/[^/]+?)"
_ROUTES = {
    "GET": [
        (r"/api/whoami-v2", "whoami"),
        (rf"/api/models/{_REPO}/tree/([^/]+)(?:/(.+))?", "tree"),
        (rf"/api/models/{_REPO}/refs", "refs"),
        (rf"/api/models/{_REPO}/revision/([^/]+)", "repo_info"),
        (rf"/api/models/{_REPO}", "repo_info"),
    ],
    "POST": [
        (r"/api/repos/create", "create_repo"),
        (r"/api/validate-yaml", "validate_yaml"),
        (rf"/api/models/{_REPO}/preupload/([^/]+)", "preupload"),
        (rf"/api/models/{_REPO}/commit/([^/]+)", "commit"),
        (rf"/api/models/{_REPO}/branch/([^/]+)", "create_branch"),
        (rf"/{_REPO}\.git/info/lfs/objects/batch", "lfs_batch"),
    ],
    "PUT": [(r"/_lfs/([0-9a-f]{64})", "lfs_put")],
    "HEAD": [(rf"/{_REPO}/resolve/([^/]+)/(.+)", "resolve")],
}
_ROUTES["GET"].append((rf"/{_REPO}/resolve/([^/]+)/(.+)", "resolve"))


@pytest.fixture
def fake_hub(monkeypatch, tmp_path_factory):
    """A fresh FakeHub per test, with huggingface_hub in this process (and subprocesses, through
    HF_ENDPOINT) pointed at it. The client reads HF_ENDPOINT once at import and checks commit URLs
    against it, so the already-imported constant is patched too; downloads go to a fresh cache
    (HF_HUB_CACHE), never the user's."""
    hub = FakeHub().start()
    from huggingface_hub import constants

    cache = tmp_path_factory.mktemp("hf-hub-cache")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(constants, "ENDPOINT", hub.url)
    template = hub.url + "/{repo_id}/resolve/{revision}/{filename}"
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
    from huggingface_hub import file_download  # hf_hub_url's copy of the template, taken at import

    monkeypatch.setattr(file_download, "HUGGINGFACE_CO_URL_TEMPLATE", template)
    try:
        yield hub
    finally:
        hub.stop()


if __name__ == "__main__":
    with FakeHub() as hub:
        print(f"FakeHub at {hub.url} (token {hub.token}); Ctrl-C to stop")
        while True:
            time.sleep(3600)
