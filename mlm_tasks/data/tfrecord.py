"""TFRecord files of `tf.train.Example`s, byte-identical to TensorFlow's own, encoded a block at a time in numpy.

    f.write(frame_records(encode_examples(block)))             # block: [n, max_length] ids
    for offset, record in iter_records(f, "part.tfrecord"):    # both crc32c checked; ConfigError if bad
docs/data.md#the-file-format
"""

from __future__ import annotations

import re
import struct

import google_crc32c
import numpy as np

from mlm_tasks.errors import ConfigError

FEATURES = ["input_ids", "attention_mask"]
# What the Hugging Face TF/TPU training script parses a shard's record count from (run_mlm.py count_samples).
RECORDS_IN_NAME = re.compile(r"-\d+-(\d+)\.tfrecord")


def shard_name(prefix: str, index: int, records: int) -> str:
    """`<prefix>-<index>-<records>.tfrecord`; `prefix` must not end in `-<digits>` (the regex would then
    read the index as the count)."""
    return f"{prefix}-{index:05d}-{records}.tfrecord"


def records_from_name(name: str) -> int | None:
    """The record count a file name carries, as run_mlm.py reads it; None when it carries none."""
    found = RECORDS_IN_NAME.search(name.rsplit("/", 1)[-1])
    return int(found.group(1)) if found else None


_MASK_DELTA = 0xA282EAD8


def masked_crc32c(data: bytes) -> int:
    """TFRecord's checksum: crc32c rotated right by 15 bits plus a constant."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _varint_block(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Varint bytes of every value of a [n, m] block, row after row; and the byte count per row."""
    if values.size and values.min() < 0:
        # Negative int64s take 10 bytes in protobuf; token ids never are, so refuse rather than mis-encode.
        raise ValueError("Token ids must be non-negative to be encoded as TFRecord int64 lists.")
    v = values.astype(np.uint64)
    # Bytes the largest value needs: one pass over the block, not one per possible width.
    width = max(1, (int(v.max()).bit_length() + 6) // 7) if v.size else 1
    shifts = np.arange(width, dtype=np.uint64) * np.uint64(7)
    groups = ((v[..., None] >> shifts) & np.uint64(0x7F)).astype(np.uint8)  # [n, m, width]
    nbytes = np.ones(v.shape, dtype=np.int64)
    for k in range(1, width):
        nbytes += v >= (1 << (7 * k))
    position = np.arange(width)
    groups[position < nbytes[..., None] - 1] |= 0x80  # continuation bits
    return groups[position < nbytes[..., None]], nbytes.sum(axis=1)


def _field(tag: bytes, head: bytes, payload_len: int = 0) -> bytes:
    """A length-delimited protobuf field up to its last `payload_len` bytes: tag, length, then `head`."""
    return tag + _varint(len(head) + payload_len) + head


def _feature_entry(key: str, payload_len: int) -> bytes:
    """The bytes of one Features map entry up to its packed varints: key, Feature, Int64List headers."""
    int64_list = _field(b"\x1a", b"\x0a" + _varint(payload_len), payload_len)
    return _field(b"\x0a", _field(b"\x0a", key.encode("utf-8")) + _field(b"\x12", int64_list, payload_len), payload_len)


def encode_examples(block: np.ndarray) -> list[bytes]:
    """Serialized `tf.train.Example`s, one per row of `block`: `attention_mask` (all ones: chunks are packed) and
    `input_ids`, in key order, as `SerializeToString(deterministic=True)` writes them."""
    block = np.asarray(block)
    if block.ndim != 2:
        raise ValueError(f"Expected a [records, length] block of ids, got shape {block.shape}.")
    flat, lengths = _varint_block(block)
    data = flat.tobytes()
    mask_payload = b"\x01" * block.shape[1]
    mask_entry = _feature_entry("attention_mask", len(mask_payload)) + mask_payload  # the same in every record
    # Rows of equal byte length share their headers.
    headers = {n: _field(b"\x0a", mask_entry + _feature_entry("input_ids", n), n) for n in set(lengths.tolist())}
    ends = np.cumsum(lengths).tolist()
    return [headers[n] + data[end - n : end] for n, end in zip(lengths.tolist(), ends, strict=True)]


def frame_records(records: list[bytes]) -> bytes:
    """The TFRecord file bytes holding `records` in order (no compression)."""
    parts = []
    for record in records:
        length = struct.pack("<Q", len(record))
        parts.append(
            length + struct.pack("<I", masked_crc32c(length)) + record + struct.pack("<I", masked_crc32c(record))
        )
    return b"".join(parts)


_HEADER, _FOOTER = 12, 4  # uint64 length + its crc; the data's crc


def _damaged(name: str, offset: int, what: str) -> ConfigError:
    return ConfigError(
        f"{name}: the TFRecord at byte {offset} {what}. The file was cut short or altered after "
        "it was written: copy it again from its source, or remove it from the shard set."
    )


def iter_records(f, name: str):
    """(byte offset, data) of each record of an open TFRecord file `name`, in order: both masked crc32c checked,
    a length capped by what the file holds (a corrupt one never allocates), a damaged record a `ConfigError`."""
    offset = f.tell()
    size = f.seek(0, 2)
    f.seek(offset)
    while True:
        header = f.read(_HEADER)
        if not header:
            return
        if len(header) < _HEADER:
            raise _damaged(
                name, offset, f"is truncated: the file ends {len(header)} bytes into its {_HEADER}-byte header"
            )
        if struct.unpack("<I", header[8:])[0] != masked_crc32c(header[:8]):
            hint = "" if offset else " (at byte 0: is this a TFRecord file? GZIP or ZLIB shards must be decompressed)"
            raise _damaged(name, offset, "has a wrong length checksum (length CRC)" + hint)
        (length,) = struct.unpack("<Q", header[:8])
        left = size - offset - _HEADER
        if length + _FOOTER > left:
            if length + _HEADER + _FOOTER > size:
                raise _damaged(
                    name,
                    offset,
                    f"claims {length} bytes of data, more than the whole file "
                    f"({size} bytes) holds (length beyond the file)",
                )
            raise _damaged(
                name, offset, f"is truncated: it needs {length + _FOOTER} more bytes, the file ends after {left}"
            )
        data, footer = f.read(length), f.read(_FOOTER)
        if len(data) < length or len(footer) < _FOOTER:  # the file shrank while being read
            raise _damaged(name, offset, "is truncated: the file ended while it was read")
        if struct.unpack("<I", footer)[0] != masked_crc32c(data):
            raise _damaged(name, offset, "has a wrong data checksum (data CRC)")
        yield offset, data
        offset += _HEADER + length + _FOOTER


def count_records(f, name: str) -> int:
    """Records in an open TFRecord file `name`; reads every byte, as it checks every record."""
    return sum(1 for _ in iter_records(f, name))


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("a varint runs past the end of its message")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _packed(buf: bytes) -> list[int]:
    values, pos = [], 0
    while pos < len(buf):
        n, pos = _read_varint(buf, pos)
        values.append(n)
    return values


def _fields(buf: bytes):
    """(field number, wire type, value) of a protobuf message: ints for varints, bytes for the rest."""
    pos = 0
    value: int | bytes
    while pos < len(buf):
        key, pos = _read_varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _read_varint(buf, pos)
        elif wire == 2:
            size, pos = _read_varint(buf, pos)
            value, pos = buf[pos : pos + size], pos + size
        elif wire in (1, 5):
            value, pos = buf[pos : pos + (8 if wire == 1 else 4)], pos + (8 if wire == 1 else 4)
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        if pos > len(buf):  # slicing would silently hand back a shorter field
            raise ValueError(f"field {field} runs past the end of its message")
        yield field, wire, value


def parse_example(record: bytes) -> dict[str, list[int] | str]:
    """A `tf.train.Example`'s features: the values of each int64 list; "bytes" or "float" for the others."""
    out: dict[str, list[int] | str] = {}
    for features in (v for field, _, v in _fields(record) if field == 1):
        for entry in (v for field, _, v in _fields(features) if field == 1):
            parts = {field: v for field, _, v in _fields(entry)}  # 1: the key, 2: the Feature
            key = parts.get(1, b"").decode("utf-8")
            for kind, _, values in _fields(parts.get(2, b"")):
                if kind != 3:
                    out[key] = {1: "bytes", 2: "float"}.get(kind, "unknown")
                    continue
                ints: list[int] = []
                for _, wire, v in _fields(values):
                    ints += _packed(v) if wire == 2 else [v]
                out[key] = [n - (1 << 64) if n >= 1 << 63 else n for n in ints]  # int64: two's complement
            out.setdefault(key, [])
    return out
