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
    """Positioned reads (``os.preadv``, straight into the tensor's buffer) from safetensors files; ``bytes_read``
    counts every byte read."""

    def __init__(self):
        self.bytes_read = 0
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()

    def _fd(self, f: SafetensorsFile) -> int:
        key = str(f.path)
        if key not in self._fds:
            self._fds[key] = os.open(key, os.O_RDONLY)
        return self._fds[key]

    def _read_into(self, fd: int, offset: int, out: memoryview, path) -> None:
        """Fill ``out`` with the file's bytes from ``offset``. One ``preadv`` may return fewer bytes than asked
        (Linux caps a call at 2 GiB - 4 KiB, a K3 embedding at tp 1 is 2.35 GB): it is called again for the
        rest, and only a read that returns nothing means the file ends early."""
        got = 0
        while got < len(out):
            n = os.preadv(fd, [out[got:]], offset + got)
            if n == 0:
                from nonstop.weights.errors import CheckpointError

                raise CheckpointError(f"{path}: truncated file (wanted {len(out)} bytes at offset {offset}, got {got})")
            got += n
        with self._lock:
            self.bytes_read += got

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
        scalar = not shape
        if scalar:  # a 0-d tensor: its one element, which has no dimension to slice
            if dim is not None:
                raise ValueError(f"{name}: a 0-d tensor has no dim {dim} to slice")
            shape = (1,)
        if dim is None:
            dim, start, stop = 0, 0, shape[0]
        stop = shape[dim] if stop is None else stop
        if not 0 <= start <= stop <= shape[dim]:
            raise ValueError(f"{name}: [{start}, {stop}) is not within dim {dim} of {list(shape)}")
        outer, inner = math.prod(shape[:dim]), math.prod(shape[dim + 1 :])
        run = (stop - start) * inner * item
        stride = shape[dim] * inner * item
        out_shape = list(shape)
        out_shape[dim] = stop - start
        buf = bytearray(outer * run)
        if not buf:
            return torch.empty(out_shape, dtype=dtype)
        view = memoryview(buf)
        if outer == 1 or stop - start == shape[dim]:  # one contiguous run
            self._read_into(fd, base + start * inner * item, view, f.path)
        else:
            for o in range(outer):
                self._read_into(fd, base + o * stride + start * inner * item, view[o * run : (o + 1) * run], f.path)
        return torch.frombuffer(buf, dtype=dtype).view(() if scalar else out_shape)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
