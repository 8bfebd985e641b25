"""Test helper: scatter the pages of a ModelCache's token pools before a kernel runs.

``check_kernel`` prefills each slot in one go, so every slot owns consecutive pages. Wrapping a kernel
with ``scattered_pages(kernel)`` relabels the pages with a random permutation first - each layer's pool
rows move with their page and the page table follows - so the logical content is unchanged (the
harness compares caches through the page table) but a kernel that ignores the table reads garbage.
"""

from __future__ import annotations

import torch


def scatter_pages(cache, seed: int = 0) -> None:
    """Move page p of every token pool to page perm[p] and rewrite the shared page table to match."""
    pages = cache.pages
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(pages.num_pages, generator=gen)
    for layer in cache.layers:
        if not hasattr(layer, "tensors"):
            continue
        layer.fit_pool()
        for name, t in layer.tensors.items():
            by_page = t.view(pages.num_pages, pages.page_size, *t.shape[1:])
            moved = torch.empty_like(by_page)
            moved[perm.to(t.device)] = by_page
            layer.tensors[name] = moved.view_as(t)
    pages.table = perm.to(pages.table.device)[pages.table]
    pages.slot_pages = [[int(perm[p]) for p in owned] for owned in pages.slot_pages]
    pages.free_pages = [int(perm[p]) for p in pages.free_pages]


def scattered_pages(kernel, seed: int = 0):
    """``kernel`` run on a cache whose pages were scattered by ``scatter_pages``."""

    def run(op, env):
        scatter_pages(env.cache, seed)
        return kernel(op, env)

    return run


def first_sequence_agrees(kernel):
    """``kernel`` (a cache reader such as *_attn), also run on a step of just the batch's first sequence:
    that sequence's output rows must be bit-identical to the full step's (no dependence on other rows)."""
    from nonstop.cache.state import StepBatch
    from nonstop.program.reference import StepEnv

    def run(op, env):
        kernel(op, env)
        T = env.T
        alone = StepEnv(
            {k: v[:T].clone() for k, v in env.buf.items()},
            env.cache,
            StepBatch(env.batch.slots[:1], env.batch.start[:1], T),
        )
        for name in op.writes:
            alone.buf[name].fill_(float("nan"))
        kernel(op, alone)
        for name in op.writes:
            assert torch.equal(alone.buf[name], env.buf[name][:T]), (
                f"{op.name}: {name} of sequence 0 depends on the other sequences"
            )

    return run
