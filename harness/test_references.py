"""The references themselves: their contracts, the MXFP8 rule, and the input builders."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from references import OPS, cosine
from references.mx import mxfp8_dequantize, mxfp8_quantize

DIMS = {"hidden": 2880, "eps": 1e-5}


@pytest.mark.parametrize("name", sorted(OPS))
def test_contract_docstring_states_the_rules(name):
    """The module docstring of each op's reference says what correct means."""
    import inspect

    doc = inspect.getmodule(OPS[name].reference).__doc__.lower()
    for word in ("round", "fp32", "tolerance", "cosine", "determin", "scale"):
        assert word in doc, f"{name}: contract does not mention {word!r}"
    assert OPS[name].reference.__doc__, f"{name}: reference has no docstring"


@pytest.mark.parametrize("name", sorted(OPS))
def test_builder_is_seeded(name):
    a = OPS[name].build_inputs(3, DIMS, 7)
    b = OPS[name].build_inputs(3, DIMS, 7)
    c = OPS[name].build_inputs(3, DIMS, 8)
    assert all(torch.equal(a[k], b[k]) for k in a if isinstance(a[k], torch.Tensor))
    assert not torch.equal(a["x"], c["x"])


def test_rmsnorm_matches_the_formula_in_float64():
    inputs = OPS["rmsnorm"].build_inputs(4, DIMS, 0)
    (out,) = OPS["rmsnorm"].reference(**inputs)
    x, w = inputs["x"].double(), inputs["weight"].double()
    expected = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + DIMS["eps"]) * w
    assert cosine(out.float(), expected.float()) > 0.99999
    assert out.dtype == torch.bfloat16


def test_fused_add_returns_the_rounded_sum_and_normalizes_it():
    inputs = OPS["fused_add_rmsnorm"].build_inputs(4, DIMS, 0)
    out, residual = OPS["fused_add_rmsnorm"].reference(**inputs)
    assert torch.equal(residual, (inputs["x"].float() + inputs["residual"].float()).to(torch.bfloat16))
    (plain,) = OPS["rmsnorm"].reference(residual, inputs["weight"], DIMS["eps"])
    assert torch.equal(out, plain)


def test_mxfp8_scale_rule_and_saturation():
    y = torch.zeros(1, 64)
    y[0, 0], y[0, 1] = 511.0, -300.0  # block 0: amax 511 -> exponent 8 -> s = 0, 511 saturates to 448
    q, scales = mxfp8_quantize(y)
    assert scales.tolist() == [[127, 0]]  # block 1 is all zero -> byte 0
    assert q.float()[0, :2].tolist() == [448.0, -288.0]  # -300 rounds to the E4M3 grid (288, 320 around it)
    assert q.float()[0, 32:].abs().sum() == 0


@settings(max_examples=60, deadline=None)
@given(exponent=st.integers(-60, 60), seed=st.integers(0, 2**31 - 1))
def test_mxfp8_roundtrip_error_is_bounded(exponent, seed):
    """Every element comes back within half an E4M3 step of its block's scale (relative 2^-4 of amax)."""
    gen = torch.Generator().manual_seed(seed)
    y = torch.randn(2, 96, generator=gen) * 2.0**exponent
    q, scales = mxfp8_quantize(y)
    back = mxfp8_dequantize(q, scales)
    blocks = y.reshape(2, 3, 32)
    amax = blocks.abs().amax(-1, keepdim=True)
    err = (back.reshape(2, 3, 32) - blocks).abs()
    assert (err <= amax * 2.0**-3 + 1e-30).all()
    expected_byte = torch.floor(torch.log2(amax.squeeze(-1))) - 8 + 127
    assert torch.equal(scales.float(), expected_byte.clamp(0, 254))


def test_cosine_is_nan_on_non_finite_and_one_on_equal():
    a = torch.randn(10)
    assert cosine(a, a) == pytest.approx(1.0)
    b = a.clone()
    b[3] = math.nan
    assert math.isnan(cosine(a, b))


def test_moe_pair_with_an_out_of_range_id_adds_nothing():
    """A graph-padding row's garbage expert id (negative, or >= E) selects no expert, as in the kernels'
    sort and combine: the row equals the same row with that pair's weight zeroed and a valid id."""
    from references import moe

    inputs = moe.build_moe_inputs(2, {"hidden": 64, "intermediate": 64, "experts": 4, "top_k": 2}, 0,
                                  activation="swiglu")
    base = dict(inputs)
    # Experts 0 and 1 see the same single row in both calls (so the same matmul shapes); the zeroed pairs
    # go to experts 2 and 3, which nothing else uses.
    garbage = torch.tensor([[0, 7], [-3, 1]], dtype=torch.int32)
    valid = torch.tensor([[0, 2], [3, 1]], dtype=torch.int32)
    zeroed = inputs["topk_weights"].clone()
    zeroed[0, 1], zeroed[1, 0] = 0.0, 0.0
    (out_garbage,) = moe.moe_mxfp4_swiglu(**{**base, "topk_ids": garbage})
    (out_zeroed,) = moe.moe_mxfp4_swiglu(**{**base, "topk_ids": valid, "topk_weights": zeroed})
    assert torch.equal(out_garbage, out_zeroed)
    assert out_garbage.abs().sum() > 0


def test_moe_tp_partials_sum_to_tp1_and_ranks_follow_vllm():
    """TP ranks take whole 32-column scale blocks (vLLM's gpt-oss cut); their partials, summed in rank
    order, match TP1 (a sum order change and bf16 partials: cosine, not bitwise)."""
    from references import moe

    spans = [moe.shard_columns(2880, 8, r) for r in range(8)]
    assert spans == [(384 * r, 384 * r + 384) for r in range(7)] + [(2688, 2880)]
    dims = {"hidden": 64, "intermediate": 320, "experts": 4, "top_k": 2}  # 10 blocks: 3, 3, 3 and 1 per rank
    total = torch.zeros(6, 64)
    for rank in range(4):
        assert moe.shard_columns(320, 4, rank) == (96 * rank, min(96 * rank + 96, 320))
        total += moe.moe_mxfp4_gptoss(**moe.build_moe_inputs(6, {**dims, "tp_size": 4, "tp_rank": rank}, 0,
                                                            activation="gptoss"))[0].float()
    (tp1,) = moe.moe_mxfp4_gptoss(**moe.build_moe_inputs(6, {**dims, "tp_size": 1, "tp_rank": 0}, 0,
                                                         activation="gptoss"))
    assert cosine(total, tp1.float()) >= moe.MOE_COSINE_MIN
    assert not torch.equal(total.bfloat16(), tp1)  # a real sum order change: the check could fail
