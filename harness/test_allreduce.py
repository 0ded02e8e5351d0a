"""The TP all-reduce references (references/allreduce.py): the sum order and the composition with norm."""

from __future__ import annotations

import torch

from references import OPS, norm
from references import allreduce as ar

DIMS = {"hidden": 2880, "eps": 1e-5}


def test_sum_is_fp32_in_rank_order_rounded_once():
    x = OPS["allreduce"].build_inputs(4, DIMS, 3)["x"]
    (got,) = ar.allreduce(x)
    acc = torch.zeros(x.shape[1:], dtype=torch.float32)
    for r in range(x.shape[0]):
        acc += x[r].float()
    assert torch.equal(got, acc.to(torch.bfloat16))
    # The order is part of the contract: fp32 adds in another order give other bits for some element.
    rev = torch.zeros_like(acc)
    for r in reversed(range(x.shape[0])):
        rev += x[r].float()
    assert not torch.equal(acc, rev)


def test_fused_is_allreduce_then_norm():
    inputs = OPS["allreduce_fused_add_rmsnorm"].build_inputs(3, DIMS, 5)
    out, residual = ar.allreduce_fused_add_rmsnorm(**inputs)
    (s,) = ar.allreduce(inputs["x"])
    want = norm.fused_add_rmsnorm(s, inputs["residual"], inputs["weight"], DIMS["eps"])
    assert torch.equal(out, want[0]) and torch.equal(residual, want[1])
    q, scales, res2 = ar.allreduce_fused_add_rmsnorm_mxfp8(**inputs)
    wq, ws, _ = norm.fused_add_rmsnorm_mxfp8(s, inputs["residual"], inputs["weight"], DIMS["eps"])
    assert torch.equal(q.view(torch.uint8), wq.view(torch.uint8)) and torch.equal(scales, ws)
    assert torch.equal(res2, residual)


def test_builder_stacks_eight_partials_of_unit_total_variance():
    x = OPS["allreduce"].build_inputs(64, DIMS, 0)["x"]
    assert x.shape == (8, 64, 2880) and x.dtype == torch.bfloat16
    assert 0.95 < float(ar.allreduce(x)[0].float().std()) < 1.05


def test_builder_for_one_rank_gives_that_ranks_slice():
    full = OPS["allreduce"].build_inputs(5, {**DIMS, "ranks": 8}, 11)["x"]
    for r in (0, 3, 7):
        one = OPS["allreduce"].build_inputs(5, {**DIMS, "ranks": 8, "only_rank": r}, 11)["x"]
        assert one.shape == (1, 5, 2880) and torch.equal(one[0], full[r])
