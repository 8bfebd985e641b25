"""The ``sample`` super-op: Philox bits equal Triton's, the kernel picks exactly the twin's tokens, ties
follow a stable sort, and the draws follow the filtered distribution of ``model/sampling.filter_logits``."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from nonstop.kernels.sample import KERNELS, gumbel_block, sample_op, scorer_pick, stable_key
from nonstop.model.philox import gumbel_noise, philox4x32
from nonstop.model.sampling import filter_logits
from nonstop.program.reference import REFERENCE, StepEnv


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _env(logits, params, seeds, offsets) -> StepEnv:
    """Buffers of a ``sample`` op: logits [R, V] and per-row (temperature, top_k, top_p), seed, offset."""
    R = logits.shape[0]
    return StepEnv(
        {
            "logits": logits.float().contiguous(),
            "sample_temperature": torch.tensor([p[0] for p in params], dtype=torch.float32),
            "sample_top_k": torch.tensor([p[1] for p in params], dtype=torch.int64),
            "sample_top_p": torch.tensor([p[2] for p in params], dtype=torch.float32),
            "sample_seed": torch.as_tensor(seeds, dtype=torch.int64).expand(R).clone(),
            "sample_offset": torch.as_tensor(offsets, dtype=torch.int64).expand(R).clone(),
            "next_ids": torch.full((R,), -1, dtype=torch.int64),
        },
        None,
        None,
    )


def _run_both(logits, params, seeds, offsets, **kw):
    op, _ = sample_op(logits.shape[1])
    want, got = _env(logits, params, seeds, offsets), _env(logits, params, seeds, offsets)
    REFERENCE["sample"](op, want)
    KERNELS["sample"](op, got, **kw)
    return got.buf["next_ids"], want.buf["next_ids"]


def test_philox_bits_equal_triton():
    """``model/philox.philox4x32`` against ``tl.philox`` (full 4-word counters, 64-bit keys) and
    ``tl.randint4x`` (counter = offset, 0, 0, 0), bit for bit, under the interpreter."""
    import triton
    import triton.language as tl

    @triton.jit
    def kernel(out_ptr, seed, c1, c2, N: tl.constexpr):
        i = tl.arange(0, N)
        c0 = i.to(tl.uint32) * 977 + 3
        zero = c0 * 0
        a0, a1, a2, a3 = tl.philox(seed, c0, zero + c1.to(tl.uint32), zero + c2.to(tl.uint32), zero)
        b0, _, _, b3 = tl.randint4x(seed, i * 977 + 3)
        tl.store(out_ptr + i, a0.to(tl.int64) & 0xFFFFFFFF)
        tl.store(out_ptr + N + i, a1.to(tl.int64) & 0xFFFFFFFF)
        tl.store(out_ptr + 2 * N + i, a2.to(tl.int64) & 0xFFFFFFFF)
        tl.store(out_ptr + 3 * N + i, a3.to(tl.int64) & 0xFFFFFFFF)
        tl.store(out_ptr + 4 * N + i, b0.to(tl.uint32).to(tl.int64) & 0xFFFFFFFF)
        tl.store(out_ptr + 5 * N + i, b3.to(tl.uint32).to(tl.int64) & 0xFFFFFFFF)

    N = 64
    counters = torch.arange(N) * 977 + 3
    for seed, c1, c2 in [(0, 0, 0), (123, 5, 0), (2**40 + 77, 0xFFFFFFFF, 12), (-5, 1, 2**31)]:
        out = torch.zeros(6, N, dtype=torch.int64)
        kernel[(1,)](out, seed, c1, c2, N=N)
        full = philox4x32(seed, counters, c1, c2, 0)
        for w in range(4):
            assert torch.equal(out[w], full[w]), (seed, w)
        plain = philox4x32(seed, counters)
        assert torch.equal(out[4], plain[0]) and torch.equal(out[5], plain[3])


def test_gumbel_block_matches_the_twin_noise():
    import triton
    import triton.language as tl

    @triton.jit
    def kernel(out_ptr, seed, offset, Q: tl.constexpr):
        quads = tl.arange(0, Q)
        words = tl.arange(0, 4)
        off = offset.to(tl.int64)
        g = gumbel_block(seed, (off & 0xFFFFFFFF).to(tl.uint32), (off >> 32).to(tl.uint32), quads, words)
        tl.store(out_ptr + quads[:, None] * 4 + words[None, :], g)

    for seed, offset in [(7, 0), (-3, 2**33 + 5)]:
        out = torch.empty(64)
        kernel[(1,)](out, seed, offset, Q=16)
        torch.testing.assert_close(out, gumbel_noise(seed, offset, 64), rtol=1e-6, atol=1e-6)


# (temperature, top_k, top_p): greedy, plain temperature, top-k (1, small, >= V), top-p, both
PARAMS = [
    (0.0, -1, 1.0),
    (1.0, -1, 1.0),
    (0.7, 5, 1.0),
    (1.0, 1, 1.0),
    (1.0, 500, 1.0),
    (1.3, -1, 0.8),
    (0.9, 20, 0.7),
    (1.0, 150, 0.95),
    (2.0, 3, 0.5),
    (0.5, 0, 0.3),
    (1.0, 40, 0.6),
    (3.0, 60, 0.9),
]


# (vocab, chunk, candidates listed per chunk, logit scale, steps): the default split; chunks listing every
# entry (the merged lists always decide); two entries listed per chunk (a filtered row with more than two
# kept tokens in a chunk, or top-k beyond the merged list, takes the one-program search over the row).
SAMPLE_CASES = [
    (203, None, None, 3.0, 2),
    (203, 16, 16, 0.5, 1),
    (203, 16, 2, 0.5, 1),
    (1000, 64, None, 1.0, 1),
    (1000, 256, 2, 3.0, 1),
]


@pytest.mark.parametrize("vocab,chunk,candidates,scale,steps", SAMPLE_CASES)
def test_kernel_picks_the_twin_tokens(vocab, chunk, candidates, scale, steps):
    """Every mode, several seeds and steps, several chunks per row, merged lists or the fallback search;
    flat logits (scale 0.5, 1.0) make top-k cut inside the nucleus (the search's bisection for the top-k
    mass)."""
    gen = torch.Generator().manual_seed(vocab)
    for step in range(steps):
        logits = torch.randn(len(PARAMS), vocab, generator=gen) * scale
        got, want = _run_both(
            logits,
            PARAMS,
            torch.arange(len(PARAMS)) * 7919 + step,
            torch.arange(len(PARAMS)) + 1000 * step,
            chunk=chunk,
            candidates=candidates,
        )
        assert torch.equal(got, want), (got, want)


def _stable_filter_draw(logits, temperature, top_k, top_p, noise):
    """Gumbel-max over ``filter_logits``'s kept set, with ties in the top-p sort ordered by index."""
    x = logits / temperature
    if 0 < top_k < x.shape[-1]:
        x = x.masked_fill(x < torch.topk(x, top_k).values[-1], float("-inf"))
    sorted_x, order = torch.sort(x, descending=True, stable=True)
    probs = torch.softmax(sorted_x, dim=-1)
    drop = (torch.cumsum(probs, dim=-1) - probs) >= top_p
    x = x.scatter(0, order, sorted_x.masked_fill(drop, float("-inf")))
    return int(torch.where(torch.isfinite(x), x + noise, float("-inf")).argmax())


def test_ties_follow_a_stable_sort():
    """Logits on a coarse grid (many exact ties, as bf16 logits have): tied top-k values are all kept,
    tied tokens at the top-p boundary are kept lowest index first."""
    gen = torch.Generator().manual_seed(3)
    V = 150
    params = [(1.0, 10, 1.0), (1.0, 7, 0.5), (1.0, -1, 0.3), (0.8, -1, 0.45), (1.0, 25, 0.7), (1.0, -1, 0.6)]
    logits = (torch.randn(len(params), V, generator=gen) * 1.5).round() / 2  # values k/2: heavy ties
    seeds, offsets = torch.arange(len(params)) + 11, torch.arange(len(params)) * 3
    op, _ = sample_op(V)
    env = _env(logits, params, seeds, offsets)
    KERNELS["sample"](op, env)
    for r, (t, k, p) in enumerate(params):
        want = _stable_filter_draw(logits[r], t, k, p, gumbel_noise(int(seeds[r]), int(offsets[r]), V))
        assert int(env.buf["next_ids"][r]) == want, r


def _chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    stat = ((counts - expected) ** 2 / expected).sum()
    return float(
        torch.special.gammaincc(torch.tensor((probs.numel() - 1) / 2.0, dtype=torch.float64), stat.double() / 2)
    )


CHI_CASES = [(0.8, 6, 1.0), (1.0, -1, 0.7), (1.2, 7, 0.85)]


@pytest.mark.parametrize("temperature,top_k,top_p", CHI_CASES)
def test_twin_draws_follow_the_filtered_distribution(temperature, top_k, top_p):
    """20000 draws (steps 0..19999) of the twin's stream from one row: chi-square against
    softmax(filter_logits(...)) on the kept tokens, none outside them."""
    logits = torch.tensor([2.0, 1.5, 1.4, 0.3, 0.0, -0.2, -0.5, -1.0, -2.5, 0.9, 1.1])
    x = filter_logits(logits, temperature, top_k, top_p)
    kept = torch.isfinite(x)
    N = 20000
    draws = torch.where(kept, x + gumbel_noise(12345, torch.arange(N), logits.numel()), float("-inf")).argmax(-1)
    counts = torch.bincount(draws, minlength=logits.numel()).double()
    assert counts[~kept].sum() == 0
    assert _chi_square_p(counts[kept], torch.softmax(x, -1)[kept].double()) > 1e-3


def test_kernel_draws_follow_the_filtered_distribution():
    """Draws of the kernel itself (one launch, one row per step): no token outside the kept set, equal
    to the twin's, and a chi-square test against the filtered distribution."""
    logits = torch.tensor([2.0, 1.5, 1.4, 0.3, 0.0, -0.2, -0.5, -1.0, -2.5, 0.9, 1.1])
    temperature, top_k, top_p = 1.0, 5, 0.95
    x = filter_logits(logits, temperature, top_k, top_p)
    kept = torch.isfinite(x)
    N = 96
    got, want = _run_both(logits.expand(N, -1), [(temperature, top_k, top_p)] * N, 99, torch.arange(N))
    assert torch.equal(got, want)
    counts = torch.bincount(got, minlength=logits.numel()).double()
    assert counts[~kept].sum() == 0
    assert _chi_square_p(counts[kept], torch.softmax(x, -1)[kept].double()) > 1e-3


def _paths(R: int) -> list[int]:
    from nonstop.kernels.sample import sample_paths

    return sample_paths("cpu", R)[:R].tolist()


# (name, logits of a 1200-entry row): flat, a few peaks over noise, the top 60 entries in one 128-entry chunk
DISTRIBUTIONS = {
    "flat": lambda gen: torch.randn(1200, generator=gen) * 0.05,
    "peaked": lambda gen: (
        torch.randn(1200, generator=gen) * 0.5
        + torch.zeros(1200).index_fill_(0, torch.randperm(1200, generator=gen)[:5], 8.0)
    ),
    "clustered": lambda gen: torch.randn(1200, generator=gen) + torch.cat([torch.full((60,), 4.0), torch.zeros(1140)]),
}
# (temperature, top_k, top_p) -> the ways the default lists (16 a chunk) and scorers (8) may decide each
# distribution: 1 the merged lists hold every kept entry; 2 more kept entries than a chunk lists - the best
# scorers, verified. Top-k and top-p together over the cluster: a scorer's top-p membership needs Z_k, which the
# scorers only bound; a draw whose first open scorer the bounds leave undecided takes the search (3).
FILTERS = {
    (1.0, 50, 1.0): {"flat": {1}, "peaked": {1}, "clustered": {2}},
    (1.0, -1, 0.9): {"flat": {2}, "peaked": {1}, "clustered": {2}},
    (0.8, 50, 0.9): {"flat": {1}, "peaked": {1}, "clustered": {2, 3}},
}


@pytest.mark.parametrize("dist", list(DISTRIBUTIONS))
def test_top_k_50_and_top_p_09_are_decided_by_many_programs(dist):
    """Top-k 50 and top-p 0.9, alone and together, on flat, peaked and clustered rows (128-entry chunks: 10 scan
    and 10 verify programs a row), 4 draws each (seeds and noise counters): the twin's tokens, decided by the
    merged lists or, when one chunk holds more kept entries than it lists (flat top-p keeps ~1000 entries, the
    cluster ~50), by the verified best scorers - not by the one-program search (but for ``FILTERS``' one case)."""
    gen = torch.Generator().manual_seed(len(dist))
    logits = DISTRIBUTIONS[dist](gen).expand(4 * len(FILTERS), -1).contiguous()
    params = [f for f in FILTERS for _ in range(4)]
    got, want = _run_both(logits, params, torch.arange(len(params)) * 31 + 5, torch.arange(len(params)) * 7, chunk=128)
    assert torch.equal(got, want), (got, want)
    paths = _paths(len(params))
    assert all(path in FILTERS[f][dist] for f, path in zip(params, paths)), paths
    assert paths.count(3) <= 1, paths


def test_an_undecided_row_takes_the_one_program_search():
    """Top-k 3 over lists of 2 a chunk and one verified scorer, the 10 largest values (a small bump over a flat
    row) in one chunk: the lists cannot hold the kept set and the best scorer is rarely among the 3, so most
    draws take the search over the row - still the twin's tokens. The search reads the row's 300 quads in steps
    of 64, the last one ragged, as a 163840-entry vocabulary takes 40 steps of 1024 (by default a test row fits
    one step)."""
    gen = torch.Generator().manual_seed(4)
    row = torch.randn(1200, generator=gen) * 0.05 + torch.cat([torch.full((10,), 0.3), torch.zeros(1190)])
    params = [(1.0, 3, 1.0)] * 12
    got, want = _run_both(
        row.expand(12, -1).contiguous(),
        params,
        77,
        torch.arange(12),
        chunk=64,
        candidates=2,
        scorers=1,
        search_quads=64,
    )
    assert torch.equal(got, want)
    paths = _paths(12)
    assert 3 in paths and set(paths) <= {2, 3}, paths


@triton.jit
def _scorer_probe(score_ptr, idx_ptr, scored_ptr, verify_ptr, out_ptr, k, p, z):
    i = tl.arange(0, 4)
    tl.store(scored_ptr + i, stable_key(tl.load(score_ptr + i), tl.load(idx_ptr + i)))
    use_k = (k > 0) & (k < 1000)
    use_p = p < 1.0
    row = tl.full([], 0, tl.int32)
    tl.store(out_ptr, scorer_pick(row, scored_ptr, verify_ptr, 1, k, p, use_k, use_p, z, 4, 1, 4))


def _scorer_pick(k, p, gt, ge, above, mass_ge, z=10.0) -> int:
    """``scorer_pick`` over 4 scorers (scores 4..1, entries 40, 30, 20, 10) with these verified sums."""
    verify = torch.tensor([gt, ge, above, mass_ge], dtype=torch.float32).T.contiguous()
    out = torch.full((1,), -7, dtype=torch.int32)
    scores, idx = torch.tensor([4.0, 3.0, 2.0, 1.0]), torch.tensor([40, 30, 20, 10], dtype=torch.int32)
    _scorer_probe[(1,)](scores, idx, torch.empty(4, dtype=torch.int64), verify, out, k, p, z)
    return int(out)


def test_scorer_pick_decides_only_what_the_sums_prove():
    """``scorer_pick`` on hand-made verified sums (one chunk, 4 scorers listed best first): a scorer known to be
    out (top-k: k larger values; top-p: mass above >= top_p · an upper bound of Z_k) is passed over, the first
    open one is drawn when known to be kept (mass above < top_p · a lower bound of Z_k) and -1 (the search)
    when the bounds leave it undecided."""
    zeros = [0.0] * 4
    assert _scorer_pick(-1, 0.9, zeros, zeros, [9.5, 1.0, 2.0, 3.0], zeros) == 30  # 9.5 >= 0.9 · Z: out
    assert _scorer_pick(-1, 0.9, zeros, zeros, [8.9, 1.0, 2.0, 3.0], zeros) == 40
    gt, ge, mass_ge = [0, 1, 2, 3], [1, 2, 3, 4], [1.0, 2.0, 3.0, 4.0]  # all in the top 5: Z_k in [4, 10]
    assert _scorer_pick(5, 0.9, gt, ge, [0.5, 1.5, 2.5, 3.5], mass_ge) == 40  # 0.5 < 0.9 · 4
    assert _scorer_pick(5, 0.9, gt, ge, [3.7, 1.5, 2.5, 3.5], mass_ge) == -1  # 0.9 · 4 <= 3.7 < 0.9 · 10: open
    exact = [1.0, 2.0, 3.0, 4.1]  # the last scorer holds the 5th value: Z_k = 4.1, 3.7 >= 0.9 · 4.1
    assert _scorer_pick(5, 0.9, gt, [1, 2, 3, 5], [3.7, 1.5, 2.5, 3.5], exact) == 30
    assert _scorer_pick(5, 1.0, [7, 5, 2, 3], ge, zeros, mass_ge) == 20  # 7 and 5 larger values: out of the top 5
