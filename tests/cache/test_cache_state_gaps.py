"""Decode-cache contracts a mutation audit found unchecked: step geometry, paged write / read across pool
growth and table widening, slot reuse after reset, speculative commit, page reuse and per-slot state sizes.

Expected values come from hand arithmetic on the definitions in ``nonstop.cache`` (page arithmetic, the
commit contract, the configs' shapes), never from the code under test.
"""

from __future__ import annotations

import pytest
import torch

from nonstop.cache.pages import PageTable, pool_rows
from nonstop.cache.state import KDAState, KVCache, ModelCache, StepBatch
from nonstop.config import ModelConfig
from tests.engine.tiny_models import TINY_MODELS
from tests.tiny_configs import KIMI_LINEAR_RELEASE


def _cfg(name: str) -> ModelConfig:
    return ModelConfig.from_file(TINY_MODELS[name])


def _kv(cache: ModelCache) -> KVCache:
    return cache.layers[0]


def _write(cache: ModelCache, slots: list[int], T: int, values: list[list[float]]) -> StepBatch:
    """One step on every GQA layer: row b's token t stores values[b][t] in all of k and v (the batch is
    made by hand, so the layers' own write must reserve the pages and grow the pool)."""
    index = torch.tensor(slots)
    batch = StepBatch(index, cache.lengths[index].clone(), T)
    g = cache.cfg.gqa
    v = torch.tensor(values, dtype=torch.float32)[:, :, None, None].expand(len(slots), T, g.num_kv_heads, g.head_dim)
    for layer in cache.layers:
        layer.write(batch, k=v, v=-v)
    cache.advance(batch)
    return batch


def _stored(cache: ModelCache, slot: int, length: int) -> list[float]:
    """k of the first GQA layer at positions 0..length-1 of ``slot`` (one value per token)."""
    batch = StepBatch(torch.tensor([slot]), torch.tensor([0]), length)
    return _kv(cache).read(batch, "k")[0, :length, 0, 0].tolist()


def test_step_batch_geometry_by_hand():
    """Catches wrong positions / end / causal mask / decode_form (off-by-one, < for <=, and for or)."""
    batch = StepBatch(torch.tensor([1, 0]), torch.tensor([3, 0]), 2)
    assert batch.positions.tolist() == [[3, 4], [0, 1]]
    assert batch.end.tolist() == [5, 2]
    mask = batch.attention_mask(5)
    assert mask[0].tolist() == [[True, True, True, True, False], [True, True, True, True, True]]
    assert mask[1].tolist() == [[True, False, False, False, False], [True, True, False, False, False]]
    assert not batch.decode_form  # a 2-token prefill chunk computes in the chunked form
    assert StepBatch(torch.tensor([0]), torch.tensor([0]), 1).decode_form
    assert StepBatch(torch.tensor([0]), torch.tensor([0]), 3, keep_states=True).decode_form


def test_writes_survive_pool_growth_and_table_widening():
    """Catches a pool growth that drops or moves existing rows, a write that skips reserving or growing
    the pool, and a widened page table that loses its old columns."""
    cache = ModelCache(_cfg("llama"), num_slots=2, capacity=2, page_size=2)  # 2 pages of 2 tokens
    assert _kv(cache).capacity == 4
    _write(cache, [0], 3, [[1.0, 2.0, 3.0]])  # slot 0: pages 0, 1
    _write(cache, [1], 5, [[10.0, 11.0, 12.0, 13.0, 14.0]])  # slot 1: 3 pages; the pool grows, the table widens
    _write(cache, [0], 4, [[4.0, 5.0, 6.0, 7.0]])  # slot 0 now needs 4 pages: more growth
    assert _stored(cache, 0, 7) == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    assert _stored(cache, 1, 5) == [10.0, 11.0, 12.0, 13.0, 14.0]
    assert cache.lengths.tolist() == [7, 5]
    for layer in cache.layers:  # every pool was grown to the page table's pages
        assert all(t.shape[0] == cache.pages.num_pages * 2 for t in layer.tensors.values())
        v = layer.read(StepBatch(torch.tensor([1]), torch.tensor([0]), 5), "v")[0, :, 0, 0]
        assert v.tolist() == [-10.0, -11.0, -12.0, -13.0, -14.0]


def test_read_returns_max_end_rows_and_each_rows_own_prefix():
    """Catches a read that stops at the shortest row or one token early, and writes that land on the
    wrong positions (positions / end off by one)."""
    cache = ModelCache(_cfg("llama"), num_slots=2, capacity=8, page_size=4)
    _write(cache, [0, 1], 2, [[1.0, 2.0], [5.0, 6.0]])
    _write(cache, [0], 3, [[3.0, 4.0, 4.5]])
    batch = cache.batch([0, 1], 1)  # starts 5 and 2: ends 6 and 3
    got = _kv(cache).read(batch, "k")
    assert got.shape[1] == 6
    assert got[0, :5, 0, 0].tolist() == [1.0, 2.0, 3.0, 4.0, 4.5]
    assert got[1, :2, 0, 0].tolist() == [5.0, 6.0]


def test_write_casts_to_the_cache_dtype():
    """Catches a write that stores values in their own dtype (a bf16 pool must hold bf16-rounded values)."""
    cache = ModelCache(_cfg("llama"), num_slots=1, capacity=4, dtype=torch.bfloat16)
    batch = cache.batch([0], 1)
    g = cache.cfg.gqa
    x = torch.full((1, 1, g.num_kv_heads, g.head_dim), 1.0 + 2.0**-10)  # rounds to 1.0 in bf16
    _kv(cache).write(batch, k=x, v=x)
    assert _kv(cache).tensors["k"].dtype == torch.bfloat16
    assert _kv(cache).read(batch, "k")[0, 0, 0, 0].item() == 1.0


def test_a_reused_slot_starts_a_fresh_sequence():
    """Catches a reset that keeps the slot's length, pages, KDA state or pending history (stale state
    leaking into the next sequence in that slot)."""
    cache = ModelCache(_cfg("k3"), num_slots=2, capacity=4, page_size=2)
    kda = [layer for layer in cache.layers if isinstance(layer, KDAState)]
    batch = cache.batch([0], 3, keep_states=True)  # a verification step that was never committed
    for layer in kda:
        layer.keep_recurrent(batch.slots, torch.ones(1, 3, *layer.recurrent.shape[1:]))
        layer.keep_conv(batch.slots, torch.ones(1, 3, *layer.conv.shape[1:]))
        layer.recurrent[0] = 5.0
        layer.conv[0] = 5.0
    cache.advance(batch)
    used = cache.pages.used_pages
    assert used == 2
    cache.reset(0)
    assert cache.lengths.tolist() == [0, 0] and cache.pages.used_pages == 0 and cache.pages.slot_pages[0] == []
    assert cache.pages.table[0].tolist() == [0] * cache.pages.table.shape[1]
    for layer in kda:
        assert not layer.recurrent[0].any() and not layer.conv[0].any()
    fresh = cache.batch([0], 2, keep_states=True)
    assert fresh.start.tolist() == [0]
    with pytest.raises(RuntimeError, match="not written"):  # the old step's history must not be committed
        cache.commit(fresh, [1])


def _histories(cache: ModelCache, batch: StepBatch) -> list[KDAState]:
    """Give every KDA layer a history where the state after token t of row b is 100·(layer+1) + 10·b + t."""
    kda = [layer for layer in cache.layers if isinstance(layer, KDAState)]
    B, T = batch.slots.shape[0], batch.T
    for i, layer in enumerate(kda):
        value = 100.0 * (i + 1) + 10.0 * torch.arange(B)[:, None] + torch.arange(T)[None, :]
        rec = value[:, :, None, None, None].expand(B, T, *layer.recurrent.shape[1:])
        conv = value[:, :, None, None, None].expand(B, T, *layer.conv.shape[1:])
        layer.keep_recurrent(batch.slots, rec)
        layer.keep_conv(batch.slots, conv)
    return kda


def test_commit_keeps_counts_tokens_and_the_state_after_token_counts_minus_one():
    """Catches a commit that selects the wrong history token (counts instead of counts-1, token 0),
    skips the conv window, or sets lengths to anything but start + counts."""
    cache = ModelCache(_cfg("k3"), num_slots=3, capacity=8, page_size=4)
    first = cache.batch([1], 2)
    cache.advance(first)
    batch = cache.batch([2, 1], 4, keep_states=True)  # starts 0 and 2
    kda = _histories(cache, batch)
    cache.commit(batch, [3, 1])
    assert cache.lengths.tolist() == [0, 3, 3]
    for i, layer in enumerate(kda):
        base = 100.0 * (i + 1)
        assert bool((layer.recurrent[2] == base + 2).all()) and bool((layer.recurrent[1] == base + 10).all())
        assert bool((layer.conv[2] == base + 2).all()) and bool((layer.conv[1] == base + 10).all())
        assert layer.recurrent.dtype == torch.float32
        assert not layer.recurrent[0].any()  # an untouched slot keeps its state
        assert layer.history_rows[:, [1, 2]].tolist() == [[0, 0], [0, 0]]  # consumed: no second commit
    with pytest.raises(RuntimeError, match="not written"):
        cache.commit(batch, [1, 1])


@pytest.mark.parametrize("counts", [[0, 1], [1, 5]])
def test_commit_refuses_counts_outside_one_to_T(counts):
    """Catches a commit whose range check admits 0 (state after token -1) or T + 1 tokens."""
    cache = ModelCache(_cfg("k3"), num_slots=2, capacity=8)
    batch = cache.batch([0, 1], 4, keep_states=True)
    _histories(cache, batch)
    with pytest.raises(ValueError, match="1..4"):
        cache.commit(batch, counts)
    assert cache.lengths.tolist() == [0, 0]


def test_commit_refuses_a_history_shorter_than_the_kept_tokens():
    """Catches a history check that admits reading the token just past what was written, and a
    history_for that does not mark its rows written."""
    state = KDAState(num_slots=2, num_heads=1, head_dim=2, conv_size=2, dtype=torch.float32, device="cpu")
    slots = torch.tensor([0, 1])
    state.keep_recurrent(slots, torch.ones(2, 2, 1, 2, 2))
    state.keep_conv(slots, torch.ones(2, 2, 3, 2, 1))
    with pytest.raises(RuntimeError, match="not written"):
        state.select(slots, torch.tensor([1, 2]))  # row 1 asks for token 2 of a 2-token history
    hist = state.history_for("recurrent", slots, 3)
    assert hist is state.history_recurrent and hist.shape == (2, 3, 1, 2, 2) and hist.dtype == torch.float32
    conv = state.history_for("conv", slots, 3)
    assert conv is state.history_conv and conv.shape == (2, 3, 3, 2, 1)
    assert state.history_rows.tolist() == [[3, 3], [3, 3]]
    hist[:, 2] = 4.0
    conv[:, 2] = 6.0
    state.select(slots, torch.tensor([2, 2]))
    assert bool((state.recurrent == 4.0).all()) and bool((state.conv == 6.0).all())


def test_a_commit_needs_both_histories_written():
    """Catches a keep_conv that does not mark its rows (a commit that would then miss the conv window's
    check) and a recurrent mark that goes to the conv row."""
    for keep in ("recurrent", "conv"):
        state = KDAState(num_slots=1, num_heads=1, head_dim=2, conv_size=2, dtype=torch.float32, device="cpu")
        slots = torch.tensor([0])
        if keep == "recurrent":
            state.keep_recurrent(slots, torch.ones(1, 2, 1, 2, 2))
        else:
            state.keep_conv(slots, torch.ones(1, 2, 3, 2, 1))
        assert state.history_rows[0 if keep == "recurrent" else 1].tolist() == [2]
        assert state.history_rows[1 if keep == "recurrent" else 0].tolist() == [0]


def test_advance_with_counts_keeps_only_that_many_tokens():
    """Catches an advance that ignores counts or miscounts all T tokens."""
    cache = ModelCache(_cfg("llama"), num_slots=2, capacity=8)
    batch = cache.batch([1, 0], 3)
    cache.advance(batch, [2, 1])
    assert cache.lengths.tolist() == [1, 2]
    cache.advance(cache.batch([0], 4))
    assert cache.lengths.tolist() == [5, 2]


def test_released_pages_are_reused_before_the_pool_grows():
    """Catches a release that does not return pages (or clear the slot's list / table row), a free list
    that serves the new pages before the returned ones, and a used_pages count of free pages."""
    pages = PageTable(num_slots=2, page_size=2, num_pages=4)
    pages.reserve(0, 6)  # pages 0, 1, 2
    pages.reserve(1, 2)  # page 3
    assert pages.slot_pages == [[0, 1, 2], [3]] and pages.free_pages == [] and pages.used_pages == 4
    pages.release(0)
    assert pages.slot_pages[0] == [] and pages.table[0].tolist() == [0] * pages.table.shape[1]
    assert pages.used_pages == 1
    pages.reserve(1, 6)  # two more pages: the returned ones, first page first
    assert pages.slot_pages[1] == [3, 0, 1] and pages.num_pages == 4
    pages.reserve(1, 10)  # 5 pages: 1 free (page 2), then the pool doubles and serves page 4
    assert pages.slot_pages[1] == [3, 0, 1, 2, 4] and pages.num_pages == 8 and pages.used_pages == 5
    assert pages.free_pages == [7, 6, 5]


def test_table_widening_keeps_the_slots_pages():
    """Catches a widening that loses the old columns, is too narrow for the slot, or writes the new page
    ids one column off."""
    pages = PageTable(num_slots=2, page_size=1, num_pages=2)
    assert pages.table.shape == (2, 2)
    pages.reserve(1, 1)  # page 0
    pages.reserve(0, 1)  # page 1
    pages.reserve(0, 7)  # 6 more pages in one go: wider than twice the 2 columns
    assert pages.table.shape[1] >= 7
    assert pages.table[0, :7].tolist() == pages.slot_pages[0] == [1, 2, 3, 4, 5, 6, 7]
    assert pages.table[1, 0].item() == 0
    rows = pages.rows(torch.tensor([0, 1]), torch.tensor([[0, 6], [0, 0]]))
    assert rows.tolist() == [[1, 7], [0, 0]]


def test_pool_rows_by_hand_and_past_the_tables_width():
    """Catches a row formula that drops the in-page offset, uses another slot's pages, or indexes past
    the table for positions beyond a slot's pages (they clamp to the last column)."""
    table = torch.tensor([[5, 2], [0, 7]])
    rows = pool_rows(table, 4, torch.tensor([0, 1]), torch.tensor([[0, 3, 4, 7], [1, 5, 6, 3]]))
    assert rows.tolist() == [[20, 23, 8, 11], [1, 29, 30, 3]]
    past = pool_rows(table, 4, torch.tensor([1]), torch.tensor([[9, 13]]))  # pages 2 and 3: column 1
    assert past.tolist() == [[29, 29]]


def test_reserve_counts_a_partial_page_and_is_idempotent():
    """Catches page counts rounded down, a reserve that re-takes the pages it holds, and a pool grown
    when the free list is exactly long enough."""
    pages = PageTable(num_slots=1, page_size=4, num_pages=3)
    pages.reserve(0, 9)  # 3 pages, all free ones, no growth
    assert len(pages.slot_pages[0]) == 3 and pages.num_pages == 3
    pages.reserve(0, 12)  # still 3 pages
    pages.reserve(0, 0)
    assert len(pages.slot_pages[0]) == 3 and pages.num_pages == 3


def test_an_empty_pool_gets_one_page_and_a_table_of_two_columns():
    """Catches a page table made with no pages or a single column (a compiled step would recompile)."""
    pages = PageTable(num_slots=3, page_size=8)
    assert pages.num_pages == 1 and pages.free_pages == [0] and pages.table.shape == (3, 2)


@pytest.mark.parametrize(
    ("capacity", "page_size", "pages"),
    [(5, 4, 2 * 2), (8, 4, 2 * 2), (1, 16, 2 * 1)],  # ceil(capacity / page_size) pages per slot, 2 slots
)
def test_the_initial_pool_holds_capacity_per_slot_in_whole_pages(capacity, page_size, pages):
    """Catches an initial pool that rounds a partial page down or counts pages as rows."""
    cache = ModelCache(_cfg("llama"), num_slots=2, capacity=capacity, page_size=page_size)
    assert cache.pages.num_pages == pages
    assert _kv(cache).capacity == pages * page_size
    alone = KVCache(2, 17, 1, 4, torch.float32, "cpu")  # its own table: 16-token pages, 2 per slot
    assert alone.capacity == 2 * 2 * 16


@pytest.mark.parametrize(
    ("dtype", "per_sequence"),
    [
        # 4 KDA layers x (recurrent 2 heads x 16 x 16 fp32 + conv 3 x (2 x 16) x (4 - 1) in the model dtype)
        (torch.float32, 4 * (2 * 16 * 16 * 4 + 3 * 32 * 3 * 4)),
        (torch.bfloat16, 4 * (2 * 16 * 16 * 4 + 3 * 32 * 3 * 2)),
    ],
)
def test_kda_state_bytes_per_sequence_by_hand(dtype, per_sequence):
    """Catches a recurrent state kept in the model dtype and a conv window of K instead of K - 1 columns."""
    cache = ModelCache(_cfg("k3"), num_slots=2, dtype=dtype)
    kda = [layer for layer in cache.layers if isinstance(layer, KDAState)]
    total = sum(t[0].numel() * t.element_size() for layer in kda for t in (layer.recurrent, layer.conv))
    assert total == per_sequence
    assert all(layer.recurrent.dtype == torch.float32 and layer.conv.dtype == dtype for layer in kda)


def test_pending_histories_of_two_slots_with_the_same_T_both_commit():
    """Catches a history reallocated (zeroed) by a later keep_states step of the same T, which would lose
    another slot's pending history."""
    state = KDAState(num_slots=2, num_heads=1, head_dim=2, conv_size=2, dtype=torch.float32, device="cpu")
    for slot, value in ((0, 3.0), (1, 8.0)):
        index = torch.tensor([slot])
        state.keep_recurrent(index, torch.full((1, 2, 1, 2, 2), value))
        state.keep_conv(index, torch.full((1, 2, 3, 2, 1), value))
    assert state.history_recurrent.shape[1] == 2 and state.history_conv.shape[1] == 2  # room for T, no more
    state.select(torch.tensor([0, 1]), torch.tensor([1, 1]))
    assert state.recurrent[0].unique().tolist() == [3.0] and state.recurrent[1].unique().tolist() == [8.0]
    assert state.conv[0].unique().tolist() == [3.0] and state.conv[1].unique().tolist() == [8.0]


def test_a_one_page_pool_of_one_token_pages_grows_for_a_second_token():
    """Catches a pool-growth check that is one row short (a 1-row pool not grown to 2 rows)."""
    cache = ModelCache(_cfg("llama"), num_slots=1, capacity=1, page_size=1)
    assert _kv(cache).capacity == 1
    _write(cache, [0], 1, [[4.0]])
    _write(cache, [0], 1, [[9.0]])
    assert _stored(cache, 0, 2) == [4.0, 9.0]


def test_a_reservation_past_double_the_pool_grows_it_by_exactly_the_shortfall():
    """Catches a growth that ignores the pages still free (over-allocating the pool)."""
    pages = PageTable(num_slots=2, page_size=1, num_pages=2)
    pages.reserve(0, 1)  # page 0; page 1 stays free
    pages.reserve(1, 6)  # 6 pages, 1 free: the pool needs 2 + 5 = 7 pages, more than doubling's 4
    assert pages.num_pages == 7 and pages.free_pages == []
    assert pages.slot_pages[1] == [1, 2, 3, 4, 5, 6]


def test_histories_take_states_in_any_dtype():
    """Catches keep_recurrent / keep_conv storing without casting (an index write of another dtype fails):
    bf16 recurrent states go into the fp32 history, fp32 windows into a bf16 conv history."""
    state = KDAState(num_slots=1, num_heads=1, head_dim=2, conv_size=2, dtype=torch.bfloat16, device="cpu")
    slots = torch.tensor([0])
    state.keep_recurrent(slots, torch.full((1, 2, 1, 2, 2), 1.5, dtype=torch.bfloat16))
    state.keep_conv(slots, torch.full((1, 2, 3, 2, 1), 2.5, dtype=torch.float32))
    assert state.history_recurrent.dtype == torch.float32 and state.history_conv.dtype == torch.bfloat16
    state.select(slots, torch.tensor([1]))
    assert bool((state.recurrent == 1.5).all()) and bool((state.conv == 2.5).all())


def test_a_longer_history_keeps_another_slots_uncommitted_history():
    """Slot 0 keeps a 2-token history, then slot 1 a 4-token one (the history grows): slot 0's still
    commits its own state, not the zeros of a fresh history."""
    kda = KDAState(2, 1, 2, 2, torch.float32, "cpu")
    kda.keep_recurrent(torch.tensor([0]), torch.full((1, 2, 1, 2, 2), 7.0))
    kda.keep_conv(torch.tensor([0]), torch.full((1, 2, 3, 2, 1), 5.0))
    kda.keep_recurrent(torch.tensor([1]), torch.full((1, 4, 1, 2, 2), 9.0))
    kda.keep_conv(torch.tensor([1]), torch.full((1, 4, 3, 2, 1), 4.0))
    kda.select(torch.tensor([0]), torch.tensor([1]))
    assert kda.recurrent[0].eq(7.0).all() and kda.conv[0].eq(5.0).all()
    kda.select(torch.tensor([1]), torch.tensor([3]))
    assert kda.recurrent[1].eq(9.0).all() and kda.conv[1].eq(4.0).all()


def test_commit_and_advance_need_one_count_per_row():
    """One count for a 2-row batch was applied to both rows; advance took counts past T."""
    cfg = ModelConfig.from_hf_dict(KIMI_LINEAR_RELEASE)
    cache = ModelCache(cfg, 2, capacity=8)
    batch = cache.batch([0, 1], 3, keep_states=True)
    with pytest.raises(ValueError, match=r"one count per row \(2\), got \[2\]"):
        cache.commit(batch, [2])
    plain = cache.batch([0, 1], 3)
    for counts in ([1], [1, 4], [-1, 1]):
        with pytest.raises(ValueError, match=r"one count in 0\.\.3 per row \(2\)"):
            cache.advance(plain, counts)
    cache.advance(plain, [0, 3])
    assert cache.lengths.tolist() == [0, 3]
