"""How many CPU threads torch computes with: one helper every command calls for ``--threads``."""

from __future__ import annotations


def set_threads(n: int | None) -> int:
    """Use ``n`` intra-op CPU threads (None: keep the current setting); returns the count in effect."""
    import torch

    if n is not None:
        if n < 1:
            raise ValueError(f"threads must be >= 1, got {n}")
        torch.set_num_threads(n)
    return torch.get_num_threads()
