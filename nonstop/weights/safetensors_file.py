"""A memory-mapped safetensors reader that validates the header against the file.

Format: 8-byte little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets}},
then the data; offsets are relative to the end of the header. Every tensor is checked to lie inside
the file and to have exactly numel × itemsize bytes, so a truncated or corrupt file is reported with
the tensor it breaks. As the safetensors library checks, the tensors' byte ranges must tile the data
section exactly (no gap, no overlap, nothing after the last one): a wrong header length or two tensors
sharing bytes would otherwise load as shifted or aliased weights. All of it is read from the header alone.
"""

from __future__ import annotations

import json
import mmap
import stat
import struct
from pathlib import Path

import torch

from nonstop.weights.errors import CheckpointError

MAX_HEADER_BYTES = 100_000_000  # the safetensors format's own limit on the JSON header

DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


def _int(value) -> int:
    """A JSON integer (not a float, a string or a bool)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(value)
    return value


def _check_layout(path: Path, spans: list[tuple[int, int, str]], data_size: int) -> None:
    """CheckpointError unless the (begin, end, name) byte ranges, sorted, cover 0..``data_size`` of the data
    section exactly once (the safetensors library's "invalid offset" / "file not fully covered" checks)."""
    pos, prev = 0, None
    for begin, end, name in sorted(spans):
        if begin != pos:
            how = (
                f"overlaps {prev!r}, which ends at byte {pos}" if begin < pos else f"leaves bytes {pos}..{begin} unused"
            )
            raise CheckpointError(
                f"{path}: corrupt safetensors file: tensor {name!r} starts at byte {begin} of the data and {how}"
            )
        pos, prev = end, name
    if pos != data_size:
        raise CheckpointError(
            f"{path}: corrupt safetensors file: the tensors end at byte {pos} of the data but it holds {data_size} "
            "bytes (a wrong header length, or data after the last tensor)"
        )


def unreadable(path: Path) -> str | None:
    """Why ``path`` cannot be read as a regular file, from its ``stat`` alone (None: it is one, or it is absent
    and not a link): a broken link, a symlink loop, no permission, a directory, a pipe (which would block a
    read forever) or a device."""
    try:
        mode = Path(path).stat().st_mode
    except FileNotFoundError:
        return "a broken symbolic link" if Path(path).is_symlink() else None
    except OSError as exc:
        return exc.strerror or str(exc)
    if stat.S_ISDIR(mode):
        return "a directory, not a file"
    return None if stat.S_ISREG(mode) else "not a regular file: a pipe, socket or device"


class SafetensorsFile:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        why = unreadable(self.path)
        if why:
            raise CheckpointError(f"{self.path}: cannot read ({why})")
        try:
            size = self.path.stat().st_size
            with open(self.path, "rb") as fh:
                head = fh.read(8)
                if len(head) < 8:
                    raise CheckpointError(
                        f"{self.path}: truncated or corrupt safetensors file ({size} bytes, no header)"
                    )
                (n,) = struct.unpack("<Q", head)
                if n > MAX_HEADER_BYTES:  # before reading it: a corrupt length would read a shard into memory
                    raise CheckpointError(
                        f"{self.path}: corrupt safetensors file (a header of {n} bytes; safetensors allows at most "
                        f"{MAX_HEADER_BYTES})"
                    )
                if n > size - 8:
                    raise CheckpointError(
                        f"{self.path}: truncated or corrupt safetensors file (header of {n} bytes in a {size}-byte "
                        "file)"
                    )
                raw = fh.read(n)
        except OSError as exc:
            raise CheckpointError(f"{self.path}: cannot read ({exc.strerror})") from None
        try:
            header = json.loads(raw)
        except (ValueError, RecursionError):  # not JSON, not UTF-8, an integer past the parser's digit limit
            raise CheckpointError(f"{self.path}: corrupt safetensors header (not JSON)") from None
        if not isinstance(header, dict):
            raise CheckpointError(
                f"{self.path}: corrupt safetensors header (a JSON object of tensors expected, got "
                f"{type(header).__name__})"
            )
        header.pop("__metadata__", None)
        self.data_start = 8 + n
        data_size = size - self.data_start
        self.entries: dict[str, tuple[torch.dtype, tuple[int, ...], int, int]] = {}
        spans = []
        for name, e in header.items():
            if isinstance(e, dict) and isinstance(e.get("dtype"), str) and e["dtype"] not in DTYPES:
                raise CheckpointError(
                    f"{self.path}: tensor {name!r} has dtype {e['dtype']!r}, which nonstop cannot "
                    f"read (known: {', '.join(DTYPES)})"
                )
            try:
                dtype = DTYPES[e["dtype"]]
                shape = tuple(_int(s) for s in e["shape"])
                begin, end = (_int(o) for o in e["data_offsets"])
            except (KeyError, TypeError, ValueError):
                entry = str(e)[:200]
                raise CheckpointError(f"{self.path}: corrupt header entry for tensor {name!r}: {entry}") from None
            if any(d < 0 for d in shape):
                raise CheckpointError(
                    f"{self.path}: corrupt header entry for tensor {name!r}: negative shape {list(shape)}"
                )
            numel = 1
            for s in shape:
                numel *= s
            nbytes = numel * torch.empty(0, dtype=dtype).element_size()
            if end > data_size:
                raise CheckpointError(
                    f"{self.path}: truncated file: tensor {name!r} ends at byte {end} of the data but the file holds "
                    f"{data_size}"
                )
            if end - begin != nbytes or begin < 0:
                raise CheckpointError(
                    f"{self.path}: corrupt tensor {name!r}: {end - begin} bytes stored for shape {list(shape)} "
                    f"{e['dtype']}"
                )
            self.entries[name] = (dtype, shape, begin, end)
            spans.append((begin, end, name))
        _check_layout(self.path, spans, data_size)
        self._mmap = None

    def names(self) -> list[str]:
        return list(self.entries)

    def meta(self, name: str) -> tuple[torch.dtype, tuple[int, ...]]:
        dtype, shape, _, _ = self.entries[name]
        return dtype, shape

    def tensor(self, name: str) -> torch.Tensor:
        """A tensor viewing the memory-mapped file (copy-on-write: the file is never modified)."""
        dtype, shape, begin, end = self.entries[name]
        if self._mmap is None:
            with open(self.path, "rb") as fh:
                self._mmap = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
        if end == begin:
            return torch.empty(shape, dtype=dtype)
        flat = torch.frombuffer(
            self._mmap,
            dtype=dtype,
            count=(end - begin) // torch.empty(0, dtype=dtype).element_size(),
            offset=self.data_start + begin,
        )
        return flat.view(shape)
