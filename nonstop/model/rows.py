"""Row-exact mode: every row of a step computed exactly as a step of that one row would compute it.

Speculative verification runs the T = k+1 rows [last token, d1..dk] of a sequence in one forward,
and greedy speculative decoding must emit exactly the tokens of plain one-token decoding. Matrix
products (BLAS picks its blocking and summation order from the number of rows) and attention over a
cache (the key length differs) are the only operations of a step whose result for one row depends on
the other rows. Inside ``row_exact()`` those few primitives run one row at a time with the shapes of
a one-token step; everything elementwise or reduced within a row is unchanged. Outside it (the
default) nothing changes.

The flag is a context variable, so an engine thread and the main thread do not see each other's.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from contextlib import contextmanager

import torch

_ROW_EXACT: contextvars.ContextVar[bool] = contextvars.ContextVar("nonstop_row_exact", default=False)


@contextmanager
def row_exact(enabled: bool = True):
    """Within the block, row-mixing primitives compute row by row (see the module docstring)."""
    token = _ROW_EXACT.set(enabled)
    try:
        yield
    finally:
        _ROW_EXACT.reset(token)


@torch.compiler.assume_constant_result
def is_row_exact() -> bool:
    """The flag; a compiled function bakes in its value when traced (the CPU executor compiles only
    steps that run outside ``row_exact()`` and runs row-exact steps eagerly)."""
    return _ROW_EXACT.get()


def by_rows(fn: Callable[..., torch.Tensor], x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """fn(x, *args) computed one row at a time: x [..., n] is flattened to rows [R, n], fn sees each
    row as [1, n], and the results are stacked back to [..., m]."""
    rows = x.reshape(-1, x.shape[-1])
    out = torch.cat([fn(rows[r : r + 1], *args, **kwargs) for r in range(rows.shape[0])])
    return out.reshape(*x.shape[:-1], out.shape[-1])


def rowwise(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """fn(x) for an elementwise fn; in row-exact mode one row (last dim) at a time, because CPU kernels
    vectorise a tensor in blocks and finish its tail with scalar code, so an element's rounding can
    depend on where its row starts (it matters for rows shorter than a vector block, e.g. H betas)."""
    if is_row_exact() and x[..., 0].numel() > 1:
        return by_rows(fn, x)
    return fn(x)


def per_token(fn: Callable[..., torch.Tensor], *xs: torch.Tensor) -> torch.Tensor:
    """fn over each token of xs (tensors [B, T, ...]) on its own, as ``fn(*(x[b, t] as [1, 1, ...]))``
    in a one-token step; the [1, 1, ...] results stacked back to [B, T, ...]."""
    B, T = xs[0].shape[:2]
    out = torch.cat([fn(*(x[b : b + 1, t : t + 1].contiguous() for x in xs)) for b in range(B) for t in range(T)])
    return out.reshape(B, T, *out.shape[2:])


def many_rows(x: torch.Tensor) -> bool:
    """True in row-exact mode when x [B, T, ...] holds more than one token."""
    return is_row_exact() and x.shape[0] * x.shape[1] > 1


def per_query(
    fn: Callable[..., torch.Tensor],
    queries: tuple[torch.Tensor, ...],
    keys: tuple[torch.Tensor, ...],
    mask: torch.Tensor,
    *args,
) -> torch.Tensor:
    """Attention one query row at a time over exactly the keys that row sees, as in a one-token step.

    queries: tensors [B, T, ...]; keys: tensors [B, S, ...] (keys, values, latents); mask [B, T, S]
    bool and causal (row (b, t) sees keys 0..n-1, n = mask[b, t].sum()). Calls
    ``fn(*(q[b, t] as [1, 1, ...]), *(k[b, :n] as [1, n, ...]), mask [1, 1, n], *args)`` (contiguous
    copies, like the gathered cache of a one-token step) and returns the rows stacked to [B, T, ...].
    """
    B, T = queries[0].shape[:2]
    visible = mask.sum(-1).tolist()
    rows = []
    for b in range(B):
        for t in range(T):
            n = visible[b][t]
            q_row = (q[b : b + 1, t : t + 1].contiguous() for q in queries)
            k_row = (k[b : b + 1, :n].contiguous() for k in keys)
            rows.append(fn(*q_row, *k_row, mask[b : b + 1, t : t + 1, :n].contiguous(), *args))
    out = torch.cat(rows)  # [B·T, 1, ...]
    return out.reshape(B, T, *out.shape[2:])
