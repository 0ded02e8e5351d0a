"""Multi-rank kernels (kernel.toml `ranks = n`), generated from the regimes: every case on n ranks, all ranks
bitwise equal and matching the reference (harness/multirank.py)."""

from __future__ import annotations

import os

import pytest

from harness import cases, checks, discovery, multirank
from harness import device as devices
from references import OPS

PACKAGES = discovery.discover()
SHAPES = [s for s in cases.op_shapes() if s.kernel in PACKAGES and PACKAGES[s.kernel].ranks > 1]
FULL = os.environ.get("AMD_KERNELS_FULL", "") not in ("", "0")


def _param(shape, count):
    pkg = PACKAGES[shape.kernel]
    marks = []
    subset = pkg.emulator_token_counts
    if subset and count.tokens not in subset and not FULL and devices.current().emulated:
        marks.append(pytest.mark.skip(reason=f"emulator: {count.tokens} tokens is outside kernels/{shape.kernel}"
                                      "'s emulated set; AMD_KERNELS_FULL=1 runs it"))
    return pytest.param(shape, count, id=f"{shape.kernel}:{shape.op}:m{count.tokens}r{count.real}", marks=marks)


CASES = [_param(shape, count) for shape in SHAPES for count in shape.token_counts]


@pytest.mark.parametrize("shape,count", CASES)
def test_multirank(shape, count):
    pkg = PACKAGES[shape.kernel]
    seed = checks.seed_of(shape.id, count.tokens, count.real) % 100_000
    result = multirank.check_case(pkg.module, pkg.entry_for_op(shape.op), shape.op, shape.dims, count.tokens,
                                  count.real, seed, world=pkg.ranks)
    assert result.failures(OPS[shape.op].cosine_min) == [], result
