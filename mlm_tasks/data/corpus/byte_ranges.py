"""Which bytes of a list of files (end to end on one axis) a partition owns, and the lines that start in them:
a line belongs to the partition that owns its first byte, so every line lands in exactly one partition.

    for index, start, end in owned_ranges(sizes, part, num_parts): ...   # file `index`, bytes [start, end)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO

READ_BYTES = 1 << 20  # one read inside the range: a ranged request on object stores
FIRST_TAIL_READ = 1 << 10  # the first read past the range, for the rest of a straddling line; it doubles


def owned_ranges(sizes: list[int], part: int, num_parts: int) -> list[tuple[int, int, int]]:
    """(file index, start, end) of each file partition `part` of `num_parts` owns bytes of, in order."""
    total = sum(sizes)
    lo, hi = part * total // num_parts, (part + 1) * total // num_parts
    owned, offset = [], 0
    for index, size in enumerate(sizes):
        start, end = max(lo - offset, 0), min(hi - offset, size)
        if start < end:
            owned.append((index, start, end))
        offset += size
    return owned


def _chunks(f: BinaryIO, pos: int, end: int) -> Iterator[bytes]:
    """The bytes of `f` from `pos` (where it stands): up to `end` in reads of READ_BYTES, then in
    growing reads until the caller stops asking or the file ends."""
    while pos < end:
        chunk = f.read(min(READ_BYTES, end - pos))
        if not chunk:
            return
        pos += len(chunk)
        yield chunk
    size = FIRST_TAIL_READ
    while chunk := f.read(size):
        yield chunk
        size = min(2 * size, READ_BYTES)


def lines_starting_in(f: BinaryIO, start: int, end: int) -> Iterator[tuple[int, bytes]]:
    """(offset, line with its newline) of every line of the binary file `f` whose first byte lies in
    [start, end). Reads from start - 1, to learn whether a line starts at `start` (the line holding
    byte start - 1 is the previous range's), to the newline of the last line that starts before `end`."""
    if start >= end:
        return
    base = max(start - 1, 0)  # the file offset of buf[0]
    f.seek(base)
    buf, i = b"", 0  # i: where the next line starts in buf, once known
    skipping = start > 0
    for chunk in _chunks(f, base, end):
        buf = buf[i:] + chunk
        base += i
        i = 0
        if skipping:
            newline = buf.find(b"\n")
            if newline < 0:
                base, buf = base + len(buf), b""
                continue
            i, skipping = newline + 1, False
        while base + i < end:
            newline = buf.find(b"\n", i)
            if newline < 0:
                break
            yield base + i, buf[i : newline + 1]
            i = newline + 1
        if base + i >= end:
            return
    if not skipping and i < len(buf) and base + i < end:  # the file's last line, without a newline
        yield base + i, buf[i:]
