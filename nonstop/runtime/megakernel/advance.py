"""The ``advance`` op: the last task of a megakernel step prepares the next step's inputs on the device.

Per sequence b (tile b; rows b·T .. b·T + T - 1):
    ids[b·T + t] = next_ids[b·T + t]      (the tokens the step sampled; for T = 1 the next decode input)
    token_log[b, (start[b] + T) mod LOG] = next_ids[b·T + T - 1]   (the token at position start + T)
    start[b]    += T                       (the next step's first position)
    sample_offset[b·T + t] += T            (the device sampler's noise counter: the position sampled)
so consecutive decode steps of one shape need no host copies: the next launch embeds the sampled
tokens at the advanced positions (the host still reserves the cache pages and advances its own
lengths, ``ModelCache.batch`` / ``advance``). A host ``forward`` overwrites both with its arguments.
The token log lets several steps run in one launch (``MegakernelExecutor.decode_steps``): the host
reads the generated tokens by position afterwards.

Ordering: ``ids`` is declared (the embedding tasks read it, so the schedule orders this write after
them); ``start`` is declared too: ``tiling.tile_step`` adds a READ of it to every tile of an op whose
launch takes it (attention, cache append, KDA), so this op's write of it waits for all of them (they
are also ancestors of the logits that ``sample``, this op's producer, reads).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nonstop.kernels.launch import launcher
from nonstop.program.ir import BufferSpec, SuperOp

LOG = 64  # token log entries per sequence (a ring indexed by position)


@triton.jit
def advance_tile(
    b, next_ids_ptr, ids_ptr, start_ptr, log_ptr, stride_log, offset_ptr, T, LOG: tl.constexpr, BLOCK_T: tl.constexpr
):
    """ids[b·T + t] = next_ids[b·T + t] for t < T; token_log[b, (start + T) % LOG] = the last; start[b] += T;
    sample_offset[b·T + t] += T."""
    t = tl.arange(0, BLOCK_T)
    rows = b * T + t
    tl.store(ids_ptr + rows, tl.load(next_ids_ptr + rows, mask=t < T), mask=t < T)
    tl.store(offset_ptr + rows, tl.load(offset_ptr + rows, mask=t < T) + T, mask=t < T)
    start = tl.load(start_ptr + b)
    tl.store(log_ptr + b * stride_log + (start + T) % LOG, tl.load(next_ids_ptr + b * T + T - 1))
    tl.store(start_ptr + b, start + T)


advance_kernel = launcher(advance_tile)


def advance_twin(
    next_ids: torch.Tensor,
    ids: torch.Tensor,
    start: torch.Tensor,
    token_log: torch.Tensor,
    T: int,
    offset: torch.Tensor,
) -> None:
    """Plain-torch twin of ``advance_tile`` (in place): next_ids / ids / offset [B·T], start [B],
    token_log [B, LOG]."""
    B = start.shape[0]
    ids.copy_(next_ids)
    offset += T
    b = torch.arange(B, device=start.device)
    token_log[b, (start + T) % token_log.shape[1]] = next_ids.view(B, T)[:, -1]
    start += T


def advance_op() -> SuperOp:
    return SuperOp(
        "advance", "advance", None, ("next_ids", "sample_offset"), ("ids", "token_log", "sample_offset"), {}, {}
    )


def buffer_specs() -> dict:
    return {"token_log": BufferSpec("token_log", (LOG,), "int64")}


def launch(op, env) -> None:
    T, log = env.T, env.buf["token_log"]
    advance_kernel[(env.B,)](
        env.buf["next_ids"],
        env.buf["ids"],
        env.batch.start,
        log,
        log.stride(0),
        env.buf["sample_offset"],
        T,
        LOG=LOG,
        BLOCK_T=triton.next_power_of_2(T),
    )
