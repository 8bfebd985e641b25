"""Training batches: fixed-length windows packed from the token stream (documents cross windows).

An epoch cuts the stream into consecutive windows of ``seq_len + 1`` ids (neighbours share one id,
so every id is a target exactly once per epoch), starting at a random phase in ``[0, seq_len)``,
and visits them in a random order. A batch is ``batch_size`` windows: inputs ``w[:, :-1]`` and
targets ``w[:, 1:]``, both [B, T] int64.
"""

from __future__ import annotations

import numpy as np
import torch


class WindowSampler:
    """Endless shuffled epochs of packed windows over ``tokens`` [N]."""

    def __init__(self, tokens: np.ndarray, seq_len: int, batch_size: int, seed: int = 0):
        if len(tokens) < 2 * (seq_len + 1):
            raise ValueError(
                f"the training stream has {len(tokens)} token ids; windows of --seq-len {seq_len} need at least "
                f"{2 * (seq_len + 1)} (2 x (seq_len + 1), so that every epoch's random offset leaves a window): "
                "lower --seq-len or give a longer train.txt"
            )
        self.tokens = tokens
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.rng = np.random.default_rng(seed)
        self.epoch = 0
        self._starts: np.ndarray = np.zeros(0, dtype=np.int64)
        self._next = 0

    def _new_epoch(self) -> None:
        phase = int(self.rng.integers(0, self.seq_len))
        n = (len(self.tokens) - 1 - phase) // self.seq_len
        self._starts = self.rng.permutation(phase + self.seq_len * np.arange(n, dtype=np.int64))
        self._next = 0
        self.epoch += 1

    @property
    def epochs_done(self) -> float:
        """Fraction of the stream visited so far (1.0 = one full epoch)."""
        if not len(self._starts):
            return 0.0
        return self.epoch - 1 + self._next / len(self._starts)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs [B, T], targets [B, T]) int64."""
        starts = []
        while len(starts) < self.batch_size:
            if self._next >= len(self._starts):
                self._new_epoch()
            take = self._starts[self._next : self._next + self.batch_size - len(starts)]
            starts.extend(take.tolist())
            self._next += len(take)
        idx = np.asarray(starts)[:, None] + np.arange(self.seq_len + 1)[None, :]
        windows = torch.from_numpy(self.tokens[idx].astype(np.int64))
        return windows[:, :-1], windows[:, 1:]
