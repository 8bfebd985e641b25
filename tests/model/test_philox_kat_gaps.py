"""Philox4x32-10 against Random123's known-answer vectors and a plain-integer implementation: the existing
sampler tests compare the torch Philox with itself (gumbel_noise vs gumbel_noise_at), so a lost carry in the
16-bit-split multiply goes unseen there."""

from __future__ import annotations

import torch

from nonstop.model.philox import philox4x32

# Random123 kat_vectors: philox4x32 10 <counter x4> <key x2> -> <4 words>
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF, 0xFFFFFFFF), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
]


def _plain_philox(c, k0, k1):
    c = list(c)
    for _ in range(10):
        pb, pa = 0xCD9E8D57 * c[2], 0xD2511F53 * c[0]
        c = [(pb >> 32) ^ c[1] ^ k0, pb & 0xFFFFFFFF, (pa >> 32) ^ c[3] ^ k1, pa & 0xFFFFFFFF]
        k0, k1 = (k0 + 0x9E3779B9) & 0xFFFFFFFF, (k1 + 0xBB67AE85) & 0xFFFFFFFF
    return tuple(c)


def test_philox_matches_random123_known_answers():
    """Word-exact Random123 vectors (key k0 = seed mod 2^32, k1 = seed >> 32)."""
    for counter, (k0, k1), want in KAT:
        got = philox4x32(k0 | (k1 << 32) if k1 < 0x80000000 else k0 | ((k1 - (1 << 32)) << 32), *counter)
        assert tuple(int(w) for w in got) == want


def test_philox_matches_plain_integer_philox_on_many_counters():
    """Random counters and 64-bit seeds, computed with Python's exact integers (no 16-bit splitting)."""
    gen = torch.Generator().manual_seed(5)
    counters = torch.randint(0, 2**32, (4, 64), generator=gen, dtype=torch.int64)
    for seed in (0, 12345, 2**40 + 7, -3):
        got = torch.stack(philox4x32(seed, *counters), dim=0)
        k0, k1 = seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF
        for j in range(64):
            want = _plain_philox([int(counters[i, j]) for i in range(4)], k0, k1)
            assert tuple(int(got[i, j]) for i in range(4)) == want


def test_uniform_from_word_stays_inside_the_open_interval():
    """u = (2·(w >> 9) + 1) / 2^24: word 0 gives 2^-24 (not 0, whose Gumbel noise would be infinite) and the
    largest word gives 1 - 2^-24."""
    from nonstop.model.philox import uniform_from_word

    u = uniform_from_word(torch.tensor([0, 0xFFFFFFFF], dtype=torch.int64))
    assert u.tolist() == [2.0**-24, 1 - 2.0**-24]
