"""Loss-curve PNG of a training run (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def smooth(values: list[float], window: int) -> np.ndarray:
    """Trailing moving average of ``values`` over ``window`` points (shorter at the start)."""
    v = np.asarray(values, dtype=float)
    if window <= 1 or len(v) == 0:
        return v
    c = np.cumsum(np.insert(v, 0, 0.0))
    idx = np.arange(1, len(v) + 1)
    lo = np.maximum(idx - window, 0)
    return (c[idx] - c[lo]) / (idx - lo)


def plot_loss_curve(
    history: list[dict],
    evals: list[dict],
    path: str | Path,
    title: str = "",
    eval_tokens: int | None = None,
    final: tuple[int, float, str] | None = None,
) -> Path | None:
    """Train loss (raw and smoothed), periodic held-out loss (on the first ``eval_tokens`` held-out ids)
    and the ``final`` held-out point (tokens seen, NLL, label) against tokens seen; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    path = Path(path)
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    tokens = [h["tokens"] / 1e6 for h in history]
    losses = [h["loss"] for h in history]
    ax.plot(tokens, losses, color="tab:blue", alpha=0.25, linewidth=0.8, label="train (per step)")
    ax.plot(tokens, smooth(losses, 25), color="tab:blue", linewidth=1.8, label="train (25-step mean)")
    if evals:
        label = f"held-out (first {eval_tokens:,} tokens)" if eval_tokens else "held-out"
        ax.plot(
            [e["tokens"] / 1e6 for e in evals], [e["heldout_nll"] for e in evals], "o-", color="tab:red", label=label
        )
    if final is not None:
        ax.plot([final[0] / 1e6], [final[1]], "*", color="black", markersize=12, label=final[2])
    ax.set_xlabel("tokens seen (millions)")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
