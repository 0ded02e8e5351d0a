"""A whole gpt-oss-120b decoder layer (TP1, decode) on amd_kernels alone, against the layer reference.

The chain is the regime's declaration ([[layer]] in regimes/gpt_oss_120b.toml, run by harness/chain.py).
A decode run: LAYER_CONTEXTS real sequences at capture size LAYER_TOKENS (the rest graph padding with
garbage rows), LAYER_STEPS steps, each writing the K/V the next attends to. Per step: the cosine of every
op's outputs along the chain against the reference chain (each chain consuming its own outputs; printed,
so a drift is located at once), the layer output and the residual stream against their thresholds, two
kernel chains (the second in another workgroup order) bitwise equal, the caches too, and no FlyDSL compile
after the layer's warm-up. Emulator cost is the MoE's (each real row runs four experts, twice).

  ./env.sh python3 -m pytest -q -s -p no:cacheprovider harness/test_layer.py
"""

from __future__ import annotations

import os
import time

import pytest
import torch

from amd_kernels import compile_watch
from harness import chain, checks
from harness import device as devices
from harness.toolchain import REPO
from references import OPS, cosine
from references import layer as ref_layer

REGIME = REPO / "regimes" / "gpt_oss_120b.toml"
LAYER_TOKENS = 4  # capture size
LAYER_CONTEXTS = [62, 127, 1000]  # keys before step 0: a block end, the window's edge, a long window/full
LAYER_STEPS = int(os.environ.get("AMD_KERNELS_LAYER_STEPS", "2"))
# Thresholds of the chain: the layer output (MoE) and the residual stream after several quantizations fed
# by a kernel chain; the residual stream is a bf16 sum whose inputs are the O projection's and the
# previous step's, so it stays within the ops' own tolerance.
LAYER_COSINE = 0.9999
RESIDUAL_COSINE = 0.99999


def _weights_seed():
    return checks.seed_of("layer-weights")


def _to_dev(d: dict) -> dict:
    return checks.to_device(d, devices.current().torch_device)


def test_layer_declaration():
    """The TP1 chain loads and checks (entries, arguments, sources) and calls the ops in vLLM's order."""
    layer = chain.load_layer(REGIME, 1)
    assert [s.kernel for s in layer.steps] == [
        "norm/rmsnorm_h2880", "gemm/mxfp8_n5120_k2880", "attention/rope_kv_q64_kv8_d64",
        "attention/paged_q64_kv8_d64", "quant/mxfp8_k4096", "gemm/mxfp8_n2880_k4096", "norm/rmsnorm_h2880",
        "moe/route_h2880_e128_top4", "moe/mxfp4_h2880_i2880_e128_top4"]
    assert layer.first_steps[0].entry == "rmsnorm_mxfp8" and layer.steps[0].entry == "fused_add_rmsnorm_mxfp8"
    assert chain.layer_constants(layer, 0) == {"sliding_window": 128}
    assert chain.layer_constants(layer, 1) == {"sliding_window": 0}
    assert layer.phases == ("decode",)


def test_bad_declaration_is_named():
    import dataclasses

    layer = chain.load_layer(REGIME, 1)
    bad = list(layer.steps)
    bad[1] = dataclasses.replace(bad[1], args={**bad[1].args, "x": "attn.out"})  # a later step's output
    problems = chain.validate(dataclasses.replace(layer, steps=tuple(bad)))
    assert any("qkv.x" in p for p in problems), problems


@pytest.mark.parametrize("layer_idx", [0, 1])
def test_declared_chain_is_the_layer_reference(layer_idx):
    """The declaration run on the references gives references.layer.decoder_layer's bits (outputs, caches)."""
    layer = chain.load_layer(REGIME, 1)
    weights = ref_layer.build_layer_weights(_weights_seed())
    run = ref_layer.build_decode_run(2, [5, 70], 1, seed=3)
    batch = ref_layer.real_batch(run["batches"][0], 2)
    residual = None if layer_idx == 0 else run["residual"]
    caches = [{"key": run["key_cache"].clone(), "value": run["value_cache"].clone()} for _ in range(2)]
    env = chain.run_layer(layer, backend="reference", hidden=run["hidden"], residual=residual, weights=weights,
                          batch=batch, cache=caches[0], layer_idx=layer_idx)
    out, res = ref_layer.decoder_layer(run["hidden"], residual, weights, batch, caches[1]["key"],
                                       caches[1]["value"], layer_idx)
    assert torch.equal(env[layer.outputs["hidden"]], out)
    assert torch.equal(env[layer.outputs["residual"]], res)
    for name in ("key", "value"):
        assert torch.equal(caches[0][name].view(torch.uint8), caches[1][name].view(torch.uint8))


def _step_inputs(run, s, layer_idx, prev):
    """(hidden, residual) of step s, full rows: the first layer takes fresh embeddings each step (no
    residual); later layers take the previous step's (hidden, residual) - the next layer's residual add."""
    if layer_idx == 0:
        gen = torch.Generator().manual_seed(checks.seed_of("embed", s))
        return (torch.randn(run["hidden"].shape, generator=gen).to(torch.bfloat16), None)
    return prev if prev is not None else (run["hidden"], run["residual"])


@pytest.mark.parametrize("layer_idx", [0, 1], ids=["window_first_layer", "full"])
def test_decode_chain(layer_idx):
    layer = chain.load_layer(REGIME, 1)
    real = len(LAYER_CONTEXTS)
    weights = ref_layer.build_layer_weights(_weights_seed())
    run = ref_layer.build_decode_run(LAYER_TOKENS, LAYER_CONTEXTS, LAYER_STEPS, seed=checks.seed_of("layer-run"))
    dev_weights = _to_dev(weights)
    warm = {}
    for st in (*layer.first_steps, *layer.steps):
        start = time.perf_counter()
        chain._entry(st.kernel, st.entry)[1].warm_up()
        warm.setdefault(f"{st.kernel}:{st.entry}", time.perf_counter() - start)
    prepared = chain.Prepared()
    caches = [_to_dev({"key": run["key_cache"].clone(), "value": run["value_cache"].clone()}) for _ in range(2)]
    ref_cache = {"key": run["key_cache"].clone(), "value": run["value_cache"].clone()}
    kin = [None, None]  # the two kernel chains' (hidden, residual)
    rin = None
    failures = []
    for s, batch in enumerate(run["batches"]):
        envs = []
        with compile_watch.recording() as events:
            for c in range(2):
                hidden, residual = _step_inputs(run, s, layer_idx, kin[c])
                hidden = chain.padded(hidden, real, s)
                residual = None if residual is None else chain.padded(residual, real, s)
                envs.append(chain.run_layer(
                    layer, backend="kernels", hidden=hidden.to(devices.current().torch_device),
                    residual=None if residual is None else residual.to(devices.current().torch_device),
                    weights=dev_weights, batch=_to_dev(batch), cache=caches[c], layer_idx=layer_idx, real=real,
                    order_seed=None if c == 0 else checks.seed_of("layer-order", s), prepared=prepared))
                kin[c] = (envs[c][layer.outputs["hidden"]].cpu(), envs[c][layer.outputs["residual"]].cpu())
        assert compile_watch.serving_compiles(events) == []
        hidden, residual = _step_inputs(run, s, layer_idx, rin)
        ref_env = chain.run_layer(layer, backend="reference", hidden=hidden[:real],
                                  residual=None if residual is None else residual[:real], weights=weights,
                                  batch=ref_layer.real_batch(batch, real), cache=ref_cache, layer_idx=layer_idx)
        rin = (ref_env[layer.outputs["hidden"]], ref_env[layer.outputs["residual"]])

        steps = layer.first_steps if layer_idx == 0 else layer.steps
        print(f"\nlayer {layer_idx} (window {chain.layer_constants(layer, layer_idx)['sliding_window']}) "
              f"decode step {s}: {real} real rows of {LAYER_TOKENS}, contexts {[c + s for c in LAYER_CONTEXTS]}")
        for st in steps:
            for o in st.outputs:
                key = f"{st.name}.{o}"
                a, b = envs[0][key].detach().cpu()[:real], envs[1][key].detach().cpu()[:real]
                same = checks.same_rows(a, b, torch.ones(real, dtype=torch.bool))
                if not same:
                    failures.append(f"step {s} {key}: two kernel chains differ")
            got = _step_floats(st, envs[0], real)
            want = _step_floats(st, ref_env, None)
            for name in got:
                c = cosine(got[name], want[name])
                print(f"  {st.name:10s} {name:14s} cosine {c:.7f}")
        for name in ("key", "value"):
            live = batch["slot_mapping"][:real]
            g = caches[0][name].cpu().view(-1, ref_layer.KV_HEADS, ref_layer.HEAD_DIM)[live].float()
            e = ref_cache[name].view(-1, ref_layer.KV_HEADS, ref_layer.HEAD_DIM)[live].float()
            print(f"  {'cache':10s} {name + ' written':14s} cosine {cosine(g, e):.7f}")
            if not torch.equal(caches[0][name].cpu().view(torch.uint8), caches[1][name].cpu().view(torch.uint8)):
                failures.append(f"step {s} cache.{name}: two kernel chains differ")
        out_c = cosine(kin[0][0][:real].float(), rin[0].float())
        res_c = cosine(kin[0][1][:real].float(), rin[1].float())
        print(f"  layer output cosine {out_c:.7f} (>= {LAYER_COSINE}), residual {res_c:.7f} (>= {RESIDUAL_COSINE})")
        if not out_c >= LAYER_COSINE:
            failures.append(f"step {s}: layer output cosine {out_c:.7f} < {LAYER_COSINE}")
        if not res_c >= RESIDUAL_COSINE:
            failures.append(f"step {s}: residual cosine {res_c:.7f} < {RESIDUAL_COSINE}")
    print("warm-up s: " + ", ".join(f"{k} {v:.2f}" for k, v in warm.items()))
    assert failures == []


def _step_floats(st, env: dict, real: int | None) -> dict:
    """A step's compared results as fp32 (the op's to_float: MXFP8 dequantized, routing dense), plus the
    outputs to_float does not cover (the fused norms' residual)."""
    from harness import discovery

    op = OPS[discovery.discover()[st.kernel].entries[st.entry]]
    outs = tuple(env[f"{st.name}.{o}"].detach().cpu()[slice(None, real)] for o in st.outputs)
    floats = dict(zip(op.result_names, op.to_float(outs)))
    if "residual" in st.outputs and "residual" not in floats:
        floats["residual"] = env[f"{st.name}.residual"].detach().cpu()[slice(None, real)].float()
    return floats
