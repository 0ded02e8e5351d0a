"""The TP8 decoder layer (regimes/gpt_oss_120b.toml [[layer]] tp = 8) on 8 emulated ranks against the TP1 layer
reference: harness/layer_ranks.py runs the ranks; the run configuration, the inputs and the bound's derivation
are harness/test_layer.py's and harness/layer_bound.py's.

  AMD_KERNELS_LAYER_TP8=1 ./env.sh python3 -m pytest -q -s -p no:cacheprovider harness/test_layer_tp8.py

(the 8-rank chain is opt-in until it has run to the end: see its skip reason.)
"""

from __future__ import annotations

import tempfile

import torch

from harness import chain, checks, layer_bound
from harness.test_layer import LAYER_CONTEXTS, LAYER_STEPS, LAYER_TOKENS, REGIME, _slots, _step_floats, _step_inputs
from harness.test_layer import _check_drift, _weights_seed
from references import OPS, cosine, moe
from references import layer as ref_layer


# Derived as LAYER_BOUND, with the TP8 chain on the references (each rank's shard, its partials rounded to bf16
# and summed in rank order) and P rounded to bf16 as the second chain, 4 seeds x 2 steps:
#   ./env.sh python3 -m harness.layer_bound --seeds 4 --tp 8
# Its output (on the MoE checkpoint drawn per row block, references/moe.py): window (first layer) output mean
# 5.55e-4 std 3.6e-5 max 6.10e-4, residual mean 5.56e-6 std 4.3e-7 max 6.18e-6; full output mean 1.31e-4 std
# 2.9e-5 max 1.74e-4, residual mean 3.23e-7 std 1.57e-7 max 7.04e-7 (n 8 each; no expert swapped).
LAYER_BOUND_TP8 = {0: {"output": 7.171e-04, "residual": 7.473e-06},  # 1 - cosine
                   1: {"output": 2.616e-04, "residual": 1.174e-06}}
TP8_REPLICATED = ("attn_norm", "mlp_norm", "next")  # steps whose outputs every rank holds whole


def test_tp8_declaration():
    """The TP8 chain loads and checks, and calls the TP8 packages in vLLM's order."""
    layer = chain.load_layer(REGIME, 8)
    assert [s.kernel for s in layer.steps] == [
        "comm/allreduce_ranks8_h2880", "gemm/mxfp8_n640_k2880", "attention/rope_kv_q8_kv1_d64",
        "attention/paged_q8_kv1_d64", "quant/mxfp8_k512", "gemm/mxfp8_n2880_k512", "comm/allreduce_ranks8_h2880",
        "moe/mxfp4_h2880_i384_e128_top4"]
    assert (layer.first_steps[0].kernel, layer.first_steps[0].entry) == ("norm/rmsnorm_h2880", "rmsnorm_mxfp8")
    assert layer.steps[0].entry == "allreduce_fused_add_rmsnorm_mxfp8"
    assert layer.steps[6].entry == "allreduce_fused_add_rmsnorm"
    assert layer.steps[7].entry == "routed"  # the MoE with its router, on the rank's slice


def test_shards_are_vllm_cuts():
    """The shards put back together give the layer's weights (QKV rows q | k | v by heads, O columns, sinks,
    the O bias on rank 0 only), and the MoE reference on a rank's slice gives the whole checkpoint's partial."""
    w = ref_layer.build_layer_weights(_weights_seed())
    names = ("w13_blocks", "w13_scales", "w13_bias", "w2_blocks", "w2_scales", "w2_bias")
    drawn = ref_layer.drawn_experts(w)  # the lazy experts drawn once for the 8 shards
    shards = []
    for r in range(8):  # the MoE slices of ranks 0 and 7 kept (memory)
        sh = ref_layer.shard_layer_weights(drawn, r)
        shards.append(sh if r in (0, 7) else {k: v for k, v in sh.items() if k not in names})
        del sh
    del drawn
    hq, hk = 512, 64
    for name in ("qkv", "qkv_scales", "qkv_bias"):
        parts = [sh[name] for sh in shards]
        whole = torch.cat([p[:hq] for p in parts] + [p[hq:hq + hk] for p in parts] + [p[hq + hk:] for p in parts])
        assert torch.equal(whole.view(torch.uint8), w[name].view(torch.uint8)), name
    for name in ("o", "o_scales"):
        whole = torch.cat([sh[name] for sh in shards], dim=1)
        assert torch.equal(whole.view(torch.uint8), w[name].view(torch.uint8)), name
    assert torch.equal(torch.cat([sh["sinks"] for sh in shards]), w["sinks"])
    assert torch.equal(shards[0]["o_bias"], w["o_bias"]) and all(not sh["o_bias"].any() for sh in shards[1:])
    x = torch.randn(2, ref_layer.HIDDEN, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    tw, ti = moe.moe_route_softmax_topk(x, w["router_weight"], w["router_bias"], ref_layer.TOP_K)
    for r in (0, 7):  # rank 7 holds the short block run (192 columns)
        got = ref_layer.moe_rank_reference(r)(x, tw, ti, *(shards[r][k] for k in names), tp_size=8, tp_rank=r)
        want = moe.moe_mxfp4_gptoss(x, tw, ti, *(w[k] for k in names), tp_size=8, tp_rank=r)
        assert torch.equal(got[0], want[0]), r


def _gather_tp8(per_rank: list) -> dict:
    """The ranks' step outputs (real rows) -> the TP1 chain's names and layouts: the head-sharded outputs
    concatenated in rank order (QKV as q | k | v), the partial sums summed (references.allreduce), the
    replicated ones from rank 0."""
    from references import allreduce

    r0 = per_rank[0]
    out = {k: v for k, v in r0.items() if k.split(".")[0] in TP8_REPLICATED}
    qkv = [r["qkv.qkv"] for r in per_rank]
    hq = ref_layer.QUERY_HEADS // 8 * ref_layer.HEAD_DIM
    hk = ref_layer.KV_HEADS // 8 * ref_layer.HEAD_DIM
    out["qkv.qkv"] = torch.cat([q[:, :hq] for q in qkv] + [q[:, hq:hq + hk] for q in qkv]
                               + [q[:, hq + hk:] for q in qkv], dim=1)
    for k in ("rope.q", "attn.out", "o_quant.q", "o_quant.scales"):
        out[k] = torch.cat([r[k] for r in per_rank], dim=1)
    for k in ("o_proj.y", "moe.out"):
        out[k] = allreduce.allreduce(torch.stack([r[k] for r in per_rank]))[0]
    return out


def _rank_checks(per: list, where: str) -> list:
    """Every rank's two kernel chains bitwise equal, no compile after warm-up, and the replicated steps'
    outputs the same bytes on every rank."""
    failures = []
    for r, p in enumerate(per):
        if not p["chains_equal"]:
            failures.append(f"{where} rank {r}: two kernel chains differ")
        if p["compiles"]:
            failures.append(f"{where} rank {r}: compiled after warm-up: {p['compiles']}")
    for k, v in per[0]["rows"].items():
        if k.split(".")[0] in TP8_REPLICATED:
            bad = [r for r, p in enumerate(per) if not torch.equal(_u8(p["rows"][k]), _u8(v))]
            if bad:
                failures.append(f"{where} {k}: ranks {bad} differ from rank 0")
    return failures


def _reference_then_ranks(layer1, run: dict, inputs: dict, layers: list, config: dict, reals: list, rows=None,
                          sequences: int | None = None):
    """The TP1 reference chain on every step of `layers` (inputs[layer_idx][step] = (ranks' hidden parts, TP1
    hidden, residual)), then the TP8 chains on 8 rank processes (harness/layer_ranks.py) -> (refs {(layer_idx,
    step): (reference env, the reference's written cache slots)}, the ranks' results, the replicated small
    weights). rows: per step the sampled rows the reference's "tokens" steps run (chunked prefill).
    Memory: the layer's weights are built here and freed before the ranks start, which map their shards from
    disk; the caller holds no reference to them."""
    from harness import layer_ranks

    weights = ref_layer.build_layer_weights(_weights_seed())
    refs = {}
    for li in layers:
        ref_cache = {"key": run["key_cache"].clone(), "value": run["value_cache"].clone()}
        for s, batch in enumerate(run["batches"]):
            _, hidden1, residual = inputs[li][s]
            real = reals[s]
            env = chain.run_layer(layer1, backend="reference", hidden=hidden1[:real],
                                  residual=None if residual is None else residual[:real], weights=weights,
                                  batch=ref_layer.real_batch(batch, real, sequences), cache=ref_cache, layer_idx=li,
                                  rows=None if rows is None else rows[s])
            live = batch["slot_mapping"][:real]
            refs[li, s] = ({k: v for k, v in env.items() if isinstance(v, torch.Tensor)},
                           {n: _slots(ref_cache[n], live) for n in ("key", "value")})
    small = {k: weights[k] for k in ("attn_norm", "mlp_norm", "router_weight", "router_bias")}
    with tempfile.TemporaryDirectory(prefix="amdk-layer-") as tmp:
        layer_ranks.save_shards(tmp, weights, run, inputs, layers)
        del weights
        ref_layer.release_weights()
        results = layer_ranks.run(config, tmp)
    return refs, results, small


def test_decode_chain_tp8():
    """The TP8 decode chain on 8 emulated ranks, window (first) and full layer, LAYER_STEPS steps each: per step
    the layer output (ranks' MoE partials summed) and residual against the TP1 layer reference within the
    derived bounds, every routing change explained, each op on its own inputs at its tolerance (the
    all-reduces' own-input references on every rank's partials), all 8 ranks bitwise equal on the replicated
    outputs, two kernel chains bitwise equal (the second sanitized), no compile after warm-up."""

    layer1, layer8 = chain.load_layer(REGIME, 1), chain.load_layer(REGIME, 8)
    real = len(LAYER_CONTEXTS)
    run_seed, step_seed = layer_bound.run_seeds(0)
    run = ref_layer.build_decode_run(LAYER_TOKENS, LAYER_CONTEXTS, LAYER_STEPS, seed=run_seed)
    layers = [0, 1]
    inputs = {}  # layer_idx -> per step: (ranks' in.hidden, TP1 in.hidden, residual), all LAYER_TOKENS rows
    for li in layers:
        inputs[li] = []
        for s in range(LAYER_STEPS):
            hidden, residual = _step_inputs(run, s, li)
            parts, hidden1 = layer_bound.tp_inputs(hidden, residual, li, 8, layer_bound.partial_seed(step_seed, s))
            inputs[li].append((parts, hidden1, residual))
    config = {"layers": layers, "real": real, "batches": run["batches"], "seed": checks.seed_of("layer-tp8") % 100_000}
    refs, results, weights = _reference_then_ranks(layer1, run, inputs, layers, config, [real] * len(run["batches"]))
    failures = []
    for li in layers:
        bounds = LAYER_BOUND_TP8[li]
        for s, batch in enumerate(run["batches"]):
            per = [res["layers"][li][s] for res in results]
            parts, hidden1, residual = inputs[li][s]
            ref_env, ref_written = refs[li, s]
            print(f"\nTP8 layer {li} (window {chain.layer_constants(layer1, li)['sliding_window']}) decode step {s}:"
                  f" {real} real rows of {LAYER_TOKENS}, 8 ranks, seconds per step on rank 0 "
                  + ", ".join(f"{k} {v:.1f}" for k, v in per[0]["seconds"].items()))
            failures += _rank_checks(per, f"layer {li} step {s}")
            failures += _tp8_own_inputs(layer8, li, s, per, parts, residual, real, weights)
            got = _gather_tp8([p["rows"] for p in per])
            steps1 = layer1.first_steps if li == 0 else layer1.steps
            for st in steps1:
                g, w = _step_floats(st, got, None, ""), _step_floats(st, ref_env, None, "")
                for name in g:
                    print(f"  {st.name:10s} {name:14s} chain {cosine(g[name], w[name]):.7f}")
            for name in ("key", "value"):
                g = torch.cat([p["written"][name] for p in per], dim=1).float()
                print(f"  {'rope':10s} {name + ' written':14s} chain {cosine(g, ref_written[name]):.7f}")
            failures += _check_drift(layer1, got, ref_env, weights, bounds, f"layer {li} step {s}")
    print("warm-up s (rank 0): " + ", ".join(f"{k} {v:.2f}" for k, v in results[0]["warm_up"].items()))
    assert failures == []


def _u8(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def _tp8_own_inputs(layer8, li, s, per, parts, residual, real, weights) -> list[str]:
    """Each rank's ops on their own inputs (the rank's local references), and the all-reduce steps against their
    references on every rank's partials (rank 0's outputs; the ranks' equality is checked apart)."""
    from references import allreduce

    failures = []
    steps = layer8.first_steps if li == 0 else layer8.steps
    ops = {st.name: OPS[chain.discovery.discover()[st.kernel].entries[st.entry]] for st in steps}
    for r, p in enumerate(per):
        for st in steps:
            if f"local:{st.name}.{st.outputs[0]}" not in p["local"]:
                continue
            got = _step_floats(st, p["rows"], None, "")
            local = _step_floats(st, {k.removeprefix("local:"): v for k, v in p["local"].items()}, None, "")
            for name in got:
                c = cosine(got[name], local[name])
                if r == 0:
                    print(f"  {st.name:10s} {name:14s} own-inputs {c:.7f} (>= {ops[st.name].cosine_min}, rank 0)")
                if not c >= ops[st.name].cosine_min:
                    failures.append(f"layer {li} step {s} rank {r} {st.name}.{name}: own-inputs cosine {c:.7f}")
    rows0 = per[0]["rows"]
    stacked = {"mlp_norm": (torch.stack([p["rows"]["o_proj.y"] for p in per]), rows0["attn_norm.residual"],
                            weights["mlp_norm"], allreduce.allreduce_fused_add_rmsnorm, ("out", "residual"),
                            "mlp_norm"),
               "next": (torch.stack([p["rows"]["moe.out"] for p in per]), rows0["mlp_norm.residual"],
                        weights["attn_norm"], allreduce.allreduce_fused_add_rmsnorm_mxfp8,
                        ("attn_norm.q", "attn_norm.scales", "attn_norm.residual"), "next")}
    if residual is not None:
        stacked["attn_norm"] = (torch.stack([x[:real] for x in parts]), residual[:real], weights["attn_norm"],
                                allreduce.allreduce_fused_add_rmsnorm_mxfp8, ("q", "scales", "residual"), "attn_norm")
    for name, (x, res, w, ref, outs, prefix) in stacked.items():
        want = ref(x, res, w, ref_layer.EPS)
        got = tuple(rows0[f"{prefix}.{o}"] for o in outs)
        op = OPS[ref.__name__]
        for n, g, wv in zip(op.result_names, op.to_float(got), op.to_float(want)):
            c = cosine(g, wv)
            print(f"  {name:10s} {n:14s} own-inputs {c:.7f} (>= {op.cosine_min}, every rank's partials)")
            if not c >= op.cosine_min:
                failures.append(f"layer {li} step {s} {name}.{n}: own-inputs cosine {c:.7f}")
        if n_exact := [i for i in range(len(outs)) if outs[i].endswith("residual")]:
            for i in n_exact:  # the new residual is exact (references/allreduce.py)
                if not torch.equal(_u8(got[i]), _u8(want[i])):
                    failures.append(f"layer {li} step {s} {name}: the new residual is not the reference's bits")
    return failures
