"""Read part of a safetensors tensor - rows, columns or the whole - with positioned reads of exactly
its bytes, counting them (a rank of a multi-process layout reads only its share of a checkpoint).

A tensor of shape S (row-major; any reshape of its on-disk shape with the same element order, e.g.
Kimi Linear's A_log [H] from [1, 1, H, 1], or of a prefix of it, e.g. the live heads of a zero-padded
A_log) sliced to [a, b) along dim d is ``prod(S[:d])`` contiguous runs of ``(b - a) · prod(S[d+1:])``
elements: one read for rows, one per row for columns.
"""

from __future__ import annotations

import math
import os
import threading

import torch

from nonstop.weights.safetensors_file import SafetensorsFile


class SliceReader:
    """Positioned reads (``os.pread``) from safetensors files; ``bytes_read`` counts every byte read."""

    def __init__(self):
        self.bytes_read = 0
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()

    def _fd(self, f: SafetensorsFile) -> int:
        key = str(f.path)
        if key not in self._fds:
            self._fds[key] = os.open(key, os.O_RDONLY)
        return self._fds[key]

    def _pread(self, fd: int, offset: int, length: int, path) -> bytes:
        data = os.pread(fd, length, offset)
        if len(data) != length:
            from nonstop.weights.errors import CheckpointError

            raise CheckpointError(f"{path}: truncated file (wanted {length} bytes at offset {offset}, got {len(data)})")
        with self._lock:
            self.bytes_read += length
        return data

    def read(
        self,
        f: SafetensorsFile,
        name: str,
        shape: tuple[int, ...] | None = None,
        dim: int | None = None,
        start: int = 0,
        stop: int | None = None,
    ) -> torch.Tensor:
        """Tensor ``name`` of ``f`` viewed as ``shape`` (default: its own), elements [start, stop) of ``dim``
        (default: all of it). Returns a new tensor of the file's dtype."""
        dtype, disk_shape, begin, _ = f.entries[name]
        shape = tuple(disk_shape if shape is None else shape)
        if math.prod(shape) > math.prod(disk_shape):
            raise ValueError(f"{name}: cannot view {list(disk_shape)} as the larger {list(shape)}")
        item = torch.empty(0, dtype=dtype).element_size()
        fd = self._fd(f)
        base = f.data_start + begin
        if not shape:  # a 0-d tensor: its one element, which has no dimension to slice
            if dim is not None:
                raise ValueError(f"{name}: a 0-d tensor has no dim {dim} to slice")
            return torch.frombuffer(bytearray(self._pread(fd, base, item, f.path)), dtype=dtype).view(())
        if dim is None:
            dim, start, stop = 0, 0, shape[0]
        stop = shape[dim] if stop is None else stop
        if not 0 <= start <= stop <= shape[dim]:
            raise ValueError(f"{name}: [{start}, {stop}) is not within dim {dim} of {list(shape)}")
        outer, inner = math.prod(shape[:dim]), math.prod(shape[dim + 1 :])
        run = (stop - start) * inner * item
        stride = shape[dim] * inner * item
        if run == 0 or outer == 0:
            chunks = b""
        elif outer == 1 or stop - start == shape[dim]:  # one contiguous run
            chunks = self._pread(
                fd, base + start * inner * item, outer * run if stop - start == shape[dim] else run, f.path
            )
        else:
            chunks = b"".join(
                self._pread(fd, base + o * stride + start * inner * item, run, f.path) for o in range(outer)
            )
        out_shape = list(shape)
        out_shape[dim] = stop - start
        if not chunks:
            return torch.empty(out_shape, dtype=dtype)
        return torch.frombuffer(bytearray(chunks), dtype=dtype).view(out_shape)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
