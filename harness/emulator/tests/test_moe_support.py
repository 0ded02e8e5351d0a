"""Emulator pieces the MoE kernels rely on: IEEE minimum3/maximum3 (the gpt-oss clamp lowers to them),
the fast bit unpacking of MFMA operands, and interval-based distinct-byte counters."""

from __future__ import annotations

import numpy as np
import pytest

from harness.emulator import counters, numerics
from harness.emulator.tests.asmkernel import run

RNG = np.random.default_rng(5)


def test_minimum3_maximum3_propagate_nan_and_order_zeros():
    a = RNG.standard_normal(64).astype(np.float32)
    b = RNG.standard_normal(64).astype(np.float32)
    c = RNG.standard_normal(64).astype(np.float32)
    a[:4] = [np.nan, 0.0, -0.0, 1.0]
    b[:4] = [1.0, -0.0, 0.0, np.nan]
    c[:4] = [2.0, 0.0, 0.0, 0.5]
    r = run("""
      v_minimum3_f32 v10, v2, v3, v4
      v_maximum3_f32 v11, v2, v3, v4
    """, vin=[a, b, c])
    lo, hi = r.f(10), r.f(11)
    np.testing.assert_array_equal(lo[4:], np.minimum(np.minimum(a, b), c)[4:])
    np.testing.assert_array_equal(hi[4:], np.maximum(np.maximum(a, b), c)[4:])
    assert np.isnan(lo[0]) and np.isnan(hi[0]) and np.isnan(lo[3]) and np.isnan(hi[3])
    assert lo[1] == 0 and np.signbit(lo[1]) and lo[2] == 0 and np.signbit(lo[2])
    assert hi[1] == 0 and not np.signbit(hi[1]) and hi[2] == 0 and not np.signbit(hi[2])


@pytest.mark.parametrize("width", [4, 8, 16, 32])
def test_fast_unpack_matches_pack(width):
    n = 8 * 32 // width
    codes = RNG.integers(0, 1 << width, (64, n), dtype=np.uint64).astype(np.uint32)
    packed = numerics._pack_bits(codes, width, 8)
    np.testing.assert_array_equal(numerics._unpack_bits(packed, width, n), codes)


def test_distinct_dwords_and_intervals_match_brute_force():
    d, iv = counters._DistinctDwords(), counters._Intervals()
    seen_dw, seen_b = set(), set()
    for _ in range(200):
        nbytes = int(RNG.choice([1, 2, 4, 8, 16]))
        addrs = RNG.integers(1000, 1400, 64).astype(np.uint64)
        d.add(addrs, nbytes)
        iv.add(addrs, nbytes)
        for a in addrs.tolist():
            seen_dw.update(range(a >> 2, ((a + nbytes - 1) >> 2) + 1))
            seen_b.update(range(a, a + nbytes))
    assert d.bytes() == 4 * len(seen_dw)
    merged = iv.array()
    assert sum(int(e - s) for s, e in merged) == len(seen_b)
    assert all(merged[i, 1] < merged[i + 1, 0] for i in range(len(merged) - 1))
