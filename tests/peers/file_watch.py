"""Watch a folder while a run writes into it: what did a reader see, and was anything written twice?

    with FolderWatch(out_root) as watch:       # scans every 50 ms in a thread
        ...                                    # the run
    watch.partial_sightings(final_files)       # final files once seen with other bytes than their last
    watch.rewritten(final_files)               # final files replaced after they first appeared

A reader (a sensor, a training job on another machine) sees whatever a directory listing shows.
Only the files that exist at the end are judged (the shard set as the manifest lists it, the
manifest, _SUCCESS): temporary names come and go and are no reader's business. Each sighting records
the file's inode, mtime and the sha256 of its bytes, so a half-written file under its final name
shows up as a second content, and a rewrite with identical bytes still shows as a second inode/mtime.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class FolderWatch:
    def __init__(self, root: Path, interval: float = 0.05):
        self.root, self.interval = Path(root), interval
        self.signatures: dict[str, list[tuple[int, int, int]]] = {}  # rel path -> [(inode, mtime_ns, size)]
        self.contents: dict[str, list[str]] = {}  # rel path -> [sha256, ...] in order seen
        self.scans = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> FolderWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self.scan()  # the final state, seen once more

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.scan()
            self._stop.wait(self.interval)

    def scan(self) -> None:
        for dirpath, _, files in os.walk(self.root):
            for name in files:
                path = Path(dirpath) / name
                try:
                    st = path.stat()
                    signature = (st.st_ino, st.st_mtime_ns, st.st_size)
                    rel = str(path.relative_to(self.root))
                    if self.signatures.get(rel, [None])[-1] != signature:
                        digest = sha256(path)
                        self.signatures.setdefault(rel, []).append(signature)
                        if self.contents.get(rel, [None])[-1] != digest:
                            self.contents.setdefault(rel, []).append(digest)
                except OSError:  # gone between the listing and the read: a temporary file
                    continue
        self.scans += 1

    def partial_sightings(self, final_files: list[str]) -> dict[str, int]:
        """{file: how many other contents were seen under its final name} for files whose content changed."""
        return {f: len(self.contents[f]) - 1 for f in final_files if len(self.contents.get(f, [])) > 1}

    def rewritten(self, final_files: list[str]) -> dict[str, int]:
        """{file: times replaced after it first appeared}, identical bytes or not."""
        return {f: len(self.signatures[f]) - 1 for f in final_files if len(self.signatures.get(f, [])) > 1}

    def seen(self, final_files: list[str]) -> int:
        return sum(1 for f in final_files if f in self.signatures)
