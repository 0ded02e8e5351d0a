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
    same = lambda x, y: torch.equal(x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8))  # NaN too
    assert all(same(a[k], b[k]) for k in a if isinstance(a[k], torch.Tensor))
    # the first token-row input (multi-rank ops stack their ranks' rows and declare none: their first tensor)
    first = next(iter(OPS[name].row_inputs), None) or next(k for k, v in a.items() if isinstance(v, torch.Tensor))
    assert not torch.equal(a[first], c[first])


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


def test_kv_fp8_quantize_saturates_and_keeps_nan():
    """The per-tensor E4M3 KV quantizer: x / scale rounded to nearest even, +-Inf and overflow saturate to
    +-448 (E4M3 has no Inf), NaN stays NaN, in every chunk of a tensor larger than one chunk."""
    from references.attention import quantize_fp8
    x = torch.tensor([1.0, -3.0, 1e6, -1e6, float("inf"), -float("inf"), float("nan"), -float("nan"), 0.3])
    q = quantize_fp8(x.to(torch.bfloat16), torch.tensor([2.0])).float()
    assert q[:6].tolist() == [0.5, -1.5, 448.0, -448.0, 448.0, -448.0]
    assert torch.isnan(q[6:8]).all() and q[8] == torch.tensor(0.15).to(torch.float8_e4m3fn).float()
    big = torch.randn(3, 1 << 23).mul_(1000).to(torch.bfloat16)   # above one 2^24-element chunk: 2 chunks
    want = torch.where(big.float().isnan(), big.float(), (big.float() / 3).clamp(-448, 448)).to(torch.float8_e4m3fn)
    assert torch.equal(quantize_fp8(big, torch.tensor([3.0])).view(torch.uint8), want.view(torch.uint8))


def test_mxfp8_special_values_follow_the_contract():
    """NaN -> 0x7F whatever its sign; +-Inf -> +-448 in a block of byte 247, dequantized back to +-Inf."""
    y = torch.ones(1, 96)
    y[0, 3] = float("nan")
    y[0, 4] = -float("nan")
    y[0, 40] = float("-inf")
    y[0, 64:] = 2.0**-130  # a subnormal block: byte 0, scaled by 2^127 (not flushed)
    q, scales = mxfp8_quantize(y)
    codes = q.view(torch.uint8)[0]
    assert codes[3] == 0x7F and codes[4] == 0x7F
    assert codes[40] == 0xFE and scales[0].tolist() == [247, 247, 0]
    back = mxfp8_dequantize(q, scales)[0]
    assert torch.isnan(back[3:5]).all() and back[40] == float("-inf")
    assert (back[64:] > 0).all()


def test_router_ranks_a_nan_logit_last():
    x = torch.ones(1, 64, dtype=torch.bfloat16)
    w = torch.eye(4, 64, dtype=torch.bfloat16)
    b = torch.tensor([0.0, 5.0, 1.0, -float("inf")], dtype=torch.bfloat16)
    b[1] = float("nan")  # expert 1: the largest logit but NaN
    weights, ids = OPS["moe_route_softmax_topk"].reference(x, w, b, top_k=4)
    assert ids.tolist() == [[2, 0, 3, 1]]
    assert torch.isnan(weights).all()  # a NaN selected: every weight of the token is NaN
    weights, ids = OPS["moe_route_softmax_topk"].reference(x, w, b, top_k=2)
    assert ids.tolist() == [[2, 0]] and torch.isfinite(weights).all()


def test_yarn_cache_matches_the_formula_in_float64():
    """gpt-oss's cos_sin_cache: fp32 [131072, 64], cos | sin of p * f_i times mscale = 0.1 ln 32 + 1."""
    from references import attention

    cache = attention.build_cos_sin_cache()
    assert cache.shape == (131072, 64) and cache.dtype == torch.float32
    mscale = 0.1 * math.log(32) + 1
    low = 64 * math.log(4096 / (32 * 2 * math.pi)) / (2 * math.log(150000))  # truncate false: not rounded
    high = 64 * math.log(4096 / (1 * 2 * math.pi)) / (2 * math.log(150000))
    i = torch.arange(32, dtype=torch.float64)
    ramp = ((i - low) / (high - low)).clamp(0, 1)
    f = 150000.0 ** (-2 * i / 64)
    f = f / 32 * ramp + f * (1 - ramp)
    p = torch.tensor([0, 1, 7, 4095, 4096, 100000], dtype=torch.float64)
    expected = torch.cat([torch.cos(p[:, None] * f), torch.sin(p[:, None] * f)], -1) * mscale
    got = cache[p.long()].double()
    # fp32 p * f_i loses ~1e-7 relative of the angle: at p = 1e5 that is ~1e-2 rad on the fastest dim
    assert (got[:3] - expected[:3]).abs().max() < 1e-5
    assert cosine(got, expected) > 0.9999


def test_rope_kv_write_skips_slot_minus_one_and_copies_v():
    from references import attention

    inputs = OPS["rope_kv_write"].build_inputs(4, {}, 0)
    inputs["slot_mapping"][1] = -1
    before_k, before_v = inputs["key_cache"].clone(), inputs["value_cache"].clone()
    (q,) = OPS["rope_kv_write"].reference(**inputs)
    assert q.shape == (4, 64, 64)
    bs = attention.BLOCK_SIZE
    changed = (inputs["value_cache"].view(torch.int16) != before_v.view(torch.int16)).flatten(2).any(-1)
    written = {(int(s) // bs, int(s) % bs) for s in inputs["slot_mapping"] if s >= 0}
    assert {tuple(ix) for ix in changed.nonzero().tolist()} == written
    _, k, v = attention.split_qkv(inputs["qkv"], 8)
    for t, s in enumerate(inputs["slot_mapping"].tolist()):
        if s >= 0:
            assert torch.equal(inputs["value_cache"][s // bs, s % bs], v[t])
    assert (inputs["key_cache"].view(torch.int16) != before_k.view(torch.int16)).flatten(2).any(-1).sum() == 3


def _dense_attention(inputs, b, window):
    """Sequence b's rows by the textbook formula, one query at a time, in fp64 (keys gathered slot by slot)."""
    q, kc, vc = inputs["q"], inputs["key_cache"], inputs["value_cache"]
    cu, lens, table, sinks = inputs["cu_seqlens_q"], inputs["seq_lens"], inputs["block_table"], inputs["sinks"]
    hq, hkv = q.shape[1], kc.shape[2]
    q0, q1, L = int(cu[b]), int(cu[b + 1]), int(lens[b])
    rows = []
    for i in range(q1 - q0):
        pos = L - (q1 - q0) + i
        keys = [j for j in range(L) if j <= pos and (not window or pos - j < window)]
        heads = []
        for h in range(hq):
            kv = h // (hq // hkv)
            k = torch.stack([kc[table[b, j // 64], j % 64, kv] for j in keys]).double()
            v = torch.stack([vc[table[b, j // 64], j % 64, kv] for j in keys]).double()
            s = (k @ q[q0 + i, h].double()) / 8.0
            e = torch.exp(torch.cat([s, sinks[h:h + 1].double()]))
            heads.append((e[:-1, None] * v).sum(0) / e.sum())
        rows.append(torch.stack(heads))
    return torch.stack(rows)


@pytest.mark.parametrize("window", [0, 128])
def test_paged_attention_matches_the_dense_formula(window):
    """A mixed batch (decode rows, a prefill chunk, a window-crossing sequence) against the textbook formula;
    the cache's garbage (NaN, 65504) never reaches an output."""
    from references import attention

    dims = {"query_heads": 4, "kv_heads": 2, "sliding_window": window}
    inputs = attention.build_paged_attention_inputs(8, dims, 5, seq_lens=[1, 65, 200, 130], q_lens=[1, 3, 2, 1])
    (out,) = attention.paged_attention(**inputs)
    assert torch.isfinite(out.float()).all()
    cu = inputs["cu_seqlens_q"]
    for b in range(4):
        expected = _dense_attention(inputs, b, window)
        got = out[int(cu[b]):int(cu[b + 1])].double()
        assert (got - expected).abs().max() < 2e-2 * expected.abs().max()
    assert out[int(cu[-1]):].abs().sum() == 0  # rows past cu_seqlens_q[-1] belong to no sequence


def test_paged_attention_sink_enters_the_denominator_once():
    """sinks = -inf is plain softmax; a huge sink takes almost all the mass (the output shrinks towards 0)."""
    from references import attention

    inputs = attention.build_paged_attention_inputs(2, {"query_heads": 2, "kv_heads": 1}, 1, seq_lens=[5, 70])
    (plain,) = attention.paged_attention(**{**inputs, "sinks": torch.full((2,), -math.inf)})
    (huge,) = attention.paged_attention(**{**inputs, "sinks": torch.full((2,), 30.0)})
    assert plain.float().abs().sum() > 0 and huge.float().abs().max() < 1e-6
    q, kc, vc = inputs["q"].double(), inputs["key_cache"], inputs["value_cache"]
    blk = int(inputs["block_table"][0, 0])
    k, v = kc[blk, :5, 0].double(), vc[blk, :5, 0].double()
    p = torch.softmax(q[0, 0] @ k.T / 8.0, dim=0)
    assert torch.allclose(plain[0, 0].double(), p @ v, atol=1e-2)


def test_paged_attention_fp8_dequantizes_code_times_scale():
    """The fp8 tier is the bf16 reference on code * scale: with unit scales it equals paged_attention on the
    codes (each E4M3 code is a bf16 value) bit for bit; doubling v_scale doubles out; k_scale scales the
    scores (a k_scale of 0 gives every key the same weight); the builder's garbage never reaches an output."""
    from references import attention

    dims = {"query_heads": 4, "kv_heads": 2, "sliding_window": 0}
    inputs = attention.build_paged_attention_fp8_inputs(4, dims, 3, seq_lens=[1, 65, 200, 130])
    assert inputs["key_cache"].dtype == torch.float8_e4m3fn and torch.isnan(inputs["key_cache"].float()).any()
    (out,) = attention.paged_attention_fp8(**inputs)
    assert torch.isfinite(out.float()).all()
    one = torch.ones(1)
    bf16 = {**inputs, "key_cache": inputs["key_cache"].to(torch.bfloat16),
            "value_cache": inputs["value_cache"].to(torch.bfloat16)}
    del bf16["k_scale"], bf16["v_scale"]
    (plain,) = attention.paged_attention(**bf16)
    (unit,) = attention.paged_attention_fp8(**{**inputs, "k_scale": one, "v_scale": one})
    assert torch.equal(unit, plain)
    (twice,) = attention.paged_attention_fp8(**{**inputs, "v_scale": 2 * inputs["v_scale"]})
    assert torch.equal(twice.float(), 2 * out.float())
    no_sink = torch.full((4,), -math.inf)
    (flat,) = attention.paged_attention_fp8(**{**inputs, "k_scale": torch.zeros(1), "sinks": no_sink})
    b0, b1 = inputs["block_table"][1, :2].tolist()  # sequence 1: 65 keys, blocks b0 (64) and b1 (1)
    v = torch.cat([inputs["value_cache"][b0, :, 0], inputs["value_cache"][b1, :1, 0]]).double()
    v_mean = (v * inputs["v_scale"].double()).mean(0)
    assert torch.allclose(flat[1, 0].double(), v_mean, atol=1e-2)



@pytest.mark.parametrize("dims,kw", [
    ({"query_heads": 8, "kv_heads": 1, "sliding_window": 0}, {}),
    ({"query_heads": 64, "kv_heads": 8, "sliding_window": 128}, {}),
    ({"query_heads": 8, "kv_heads": 1, "sliding_window": 128, "prefill_sequences": 3, "decode_sequences": 2,
      "cached_prefix": [0, 64, 1000]}, {}),
    ({"query_heads": 4, "kv_heads": 2}, {"seq_lens": [1, 64, 65, 200, 300, 7], "q_lens": [1, 2, 3, 1, 5, 7]}),
])
def test_paged_attention_fp8_builder_is_the_bf16_cache_quantized(dims, kw):
    """The fp8 builder quantizes its value pool and garbage before copying them into blocks (cheap); that must
    give the bytes of quantizing the bf16 builder's whole cache, garbage slots included, and the same other
    inputs."""
    from references import attention

    tokens = sum(kw["q_lens"]) if "q_lens" in kw else 24
    for seed in (0, 5, 11):
        fp8 = attention.build_paged_attention_fp8_inputs(tokens, dims, seed, **kw)
        bf16 = attention.build_paged_attention_inputs(tokens, dims, seed, **kw)
        assert fp8.keys() == bf16.keys() | {"k_scale", "v_scale"}
        for name, scale in (("key_cache", fp8["k_scale"]), ("value_cache", fp8["v_scale"])):
            want = attention.quantize_fp8(bf16[name], scale)
            assert torch.equal(fp8[name].view(torch.uint8), want.view(torch.uint8)), (name, seed)
        for name, value in bf16.items():
            if name not in ("key_cache", "value_cache"):
                assert torch.equal(fp8[name], value) if torch.is_tensor(value) else fp8[name] == value, name

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


# (op, window, prefill batch): the fp8 KV tier serves decode batches only
SEQUENCE_OPS = [(name, window, prefill) for name, op in OPS.items() if op.sub_batch is not None
                for window in (128, 0) for prefill in (False, True) if not (prefill and name.endswith("fp8"))]


@pytest.mark.parametrize("op_name,window,prefill", SEQUENCE_OPS)
def test_sequence_reference_alone_equals_in_the_batch(op_name, window, prefill):
    """What lets a sampled case run the reference on its sampled sequences only: a few sequences' reference
    bits alone equal their rows of the whole batch's reference (decode, and prefill batches with decode
    sequences among them)."""
    op = OPS[op_name]
    dims = dict(query_heads=8, kv_heads=1, head_dim=64, sliding_window=window,
                context_lengths=[1, 2, 63, 65, 129, 1000])
    if prefill:
        dims.update(prefill_sequences=4, decode_sequences=2, cached_prefix=[0, 64, 1000])
    tokens = 300 if prefill else 24
    inputs = op.build_inputs(tokens, dims, 7)
    (whole,) = op.reference(**inputs)
    rows = [0, tokens // 2, tokens - 1]
    sub, full_rows = op.sub_batch(inputs, rows)
    (alone,) = op.reference(**sub)
    assert set(rows) <= set(full_rows) and alone.shape[0] == len(full_rows)
    assert torch.equal(alone.view(torch.uint8), whole[full_rows].view(torch.uint8))
    assert alone.float().abs().sum() > 0


def _one_shape_per_op(ops):
    """One regime shape of each op (the last declared: the TP8 one where an op has both)."""
    from harness import cases
    return list({s.op: s for s in cases.op_shapes() if s.op in ops}.values())


ROW_OPS = _one_shape_per_op({name for name, op in OPS.items() if op.rows_independent})


@pytest.mark.parametrize("shape", ROW_OPS, ids=lambda s: s.id)
def test_row_reference_alone_equals_in_the_batch(shape):
    """What lets a sampled case run the reference on its compared rows only (Op.rows_independent): those rows'
    reference bits alone equal theirs in the whole batch's reference."""
    op = OPS[shape.op]
    dims, tokens = shape.dims, 64
    if shape.op.startswith("moe"):  # the same reference code on smaller experts (the regime's cost seconds)
        dims = {**dims, "experts": 16, "hidden": 512, "intermediate": 512}
    inputs = op.build_inputs(tokens, dims, 11)
    rows = torch.tensor([0, tokens // 3, tokens - 1])
    whole = op.reference(**inputs)
    alone = op.reference(**{k: (v.index_select(0, rows) if k in op.row_inputs else v) for k, v in inputs.items()})
    assert len(alone) == len(whole)
    for a, w in zip(alone, whole):
        assert torch.equal(a.contiguous().view(torch.uint8), w.index_select(0, rows).contiguous().view(torch.uint8))
    assert any(a.float().abs().sum() > 0 for a in alone)


@pytest.mark.parametrize("window", [0, 128])
def test_paged_inputs_hold_values_in_each_sequences_keys_and_garbage_elsewhere(window):
    """build_paged_attention_inputs' cache layout, slot by slot: a sequence's live blocks (its table entries
    from the window's first block) hold N(0, 1) values in its first keys and the garbage block's bytes after
    them; every other block is the garbage block; table entries before the window name one garbage block,
    entries past the sequence garbage blocks."""
    from references import attention as A

    dims = {"query_heads": 8, "kv_heads": 2, "sliding_window": window}
    q_lens = [1, 1, 2, 64, 1, 7]
    inputs = A.build_paged_attention_inputs(sum(q_lens), dims, 3, seq_lens=[1, 64, 65, 200, 300, 7], q_lens=q_lens)
    table, lens = inputs["block_table"], inputs["seq_lens"].tolist()
    for cache in (inputs["key_cache"], inputs["value_cache"]):
        bits = cache.view(torch.int16)
        live, before_window = {}, set()
        for b, (L, ql) in enumerate(zip(lens, q_lens)):
            first = max(0, L - ql - window + 1) // 64 if window else 0
            for j in range(first, -(-L // 64)):
                live[int(table[b, j])] = L - 64 * j  # keys this block holds (64 or more: full)
            before_window.update(table[b, :first].tolist())
        spare = [blk for blk in range(cache.shape[0]) if blk not in live]
        pattern = bits[spare[0]]
        assert all(torch.equal(bits[blk], pattern) for blk in spare)  # one garbage block, everywhere unused
        garbage = cache[spare[0]].float()
        assert (garbage.isnan() | (garbage.abs() >= 1e3)).float().mean() > 0.9
        assert len(before_window) == (1 if window else 0) and before_window <= set(spare)
        for blk, keys in live.items():
            values = cache[blk, :min(keys, 64)].float()
            assert values.isfinite().all() and values.abs().max() < 8 and values.std() > 0.5, blk
            if keys < 64:
                assert torch.equal(bits[blk, keys:], pattern[keys:]), blk
        past = {int(t) for b, L in enumerate(lens) for t in table[b, -(-L // 64):].tolist()}
        assert past <= set(spare)
