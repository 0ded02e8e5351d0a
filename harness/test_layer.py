"""A whole gpt-oss-120b decoder layer (TP1, decode) on amd_kernels alone, against the layer reference.

The chain is the regime's declaration ([[layer]] in regimes/gpt_oss_120b.toml, run by harness/chain.py).
A decode run: LAYER_CONTEXTS real sequences at capture size LAYER_TOKENS (the rest graph padding with
garbage rows), LAYER_STEPS steps, each writing the K/V the next attends to; each step's input is the next
token's hidden states (and residual, past the first layer), the same for every chain. Per step and op, two
cosines are printed (so a drift is located at once): "own-inputs", the kernel against its op's reference
on the inputs the kernel chain gave it (asserted at the op's tolerance), and "chain", the kernel chain
against the reference chain, each consuming its own outputs and its own cache; the layer output and the
residual stream are asserted against the chain bounds below. Also per step: a second kernel chain (another
workgroup order, its own cache) gives the same bytes, caches included; no FlyDSL compile after the layer's
warm-up; and the next layer's residual add + norm on the layer's outputs. Emulator cost is the MoE's (each
real row runs four experts, in two chains).

  ./env.sh python3 -m pytest -q -s -p no:cacheprovider harness/test_layer.py
"""

from __future__ import annotations

import contextlib
import functools
import os
import time

import pytest
import torch

from amd_kernels import compile_watch
from harness import chain, checks, layer_bound
from harness import device as devices
from harness.toolchain import REPO
from references import OPS, cosine
from references import layer as ref_layer

REGIME = REPO / "regimes" / "gpt_oss_120b.toml"
# The run configuration is harness/layer_bound.py's (its bounds are derived on this run and 5 more seeds):
LAYER_TOKENS = layer_bound.TOKENS  # capture size 4
LAYER_CONTEXTS = layer_bound.CONTEXTS  # keys before step 0: 62 a block end, 127 the window's edge, 1000
LAYER_STEPS = int(os.environ.get("AMD_KERNELS_LAYER_STEPS", str(layer_bound.STEPS)))
# Each op must reach its own reference's tolerance on the inputs the kernel chain gave it ("own-inputs",
# asserted). Against the reference chain, the chain bounds are derived (harness/layer_bound.py, whose run
# configuration is this test's): the reference chain run again with the attention's P rounded to bf16 (the
# kernels' one rounding point beyond their references') drifts by these amounts; a bound is the max + 3 std
# of 1 - cosine over 6 seeds x 2 steps, per layer kind, the layer output over the rows whose experts agree
# (a rounding can swap two near-tied experts: each swap must be explained by the router inputs' difference,
# layer_bound.unexplained_flips, exact) and the residual stream over every real row.
#   ./env.sh python3 -m harness.layer_bound --seeds 6
# Its output (re-derived on the MoE checkpoint drawn per row block, references/moe.py): window (first layer)
# output mean 5.43e-4 std 5.1e-5 max 6.14e-4, residual mean 5.41e-6 std 5.6e-7 max 6.31e-6; full output mean
# 1.24e-4 std 1.8e-5 max 1.54e-4, residual mean 2.80e-7 std 1.08e-7 max 5.35e-7 (n 12 each; one window step
# swapped two experts, explained). The residuals do not depend on the MoE weights: the same as before.
LAYER_BOUND = {0: {"output": 7.664e-04, "residual": 7.984e-06},  # 1 - cosine
               1: {"output": 2.073e-04, "residual": 8.583e-07}}


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
        "moe/mxfp4_h2880_i2880_e128_top4"]
    assert layer.first_steps[0].entry == "rmsnorm_mxfp8" and layer.steps[0].entry == "fused_add_rmsnorm_mxfp8"
    assert layer.steps[-1].entry == "routed"  # the MoE with its router (vLLM's FusedMoE inputs)
    assert chain.layer_constants(layer, 0) == {"sliding_window": 128}
    assert chain.layer_constants(layer, 1) == {"sliding_window": 0}
    assert layer.phases == ("decode", "prefill")


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


def _step_inputs(run, s, layer_idx):
    """(hidden, residual) entering the layer at step s, all rows, the same for every chain: step 0 the run's,
    later steps the next token's (seeded); the first layer has no residual (its input is the embedding).
    Steps are tied by the KV cache only, so a step's drift is its own chain's (the hidden states of the
    next token come from the earlier layers, not from this layer's last output)."""
    return layer_bound.step_inputs(run, s, layer_idx, layer_bound.run_seeds(0)[1])


@pytest.mark.parametrize("layer_idx", [0, 1], ids=["window_first_layer", "full"])
def test_decode_chain(layer_idx):
    layer = chain.load_layer(REGIME, 1)
    dev = devices.current().torch_device
    real = len(LAYER_CONTEXTS)
    from amd_kernels.attention.paged_entries import EMULATOR_ALL_HEADS_KEYS

    # the emulator's real-row filter runs every KV head only up to this length (harness/chain.py)
    assert max(LAYER_CONTEXTS) + LAYER_STEPS <= EMULATOR_ALL_HEADS_KEYS
    weights = ref_layer.build_layer_weights(_weights_seed())
    run = ref_layer.build_decode_run(LAYER_TOKENS, LAYER_CONTEXTS, LAYER_STEPS, seed=layer_bound.run_seeds(0)[0])
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
        seconds = {}  # step -> seconds of the first kernel chain's call
        with compile_watch.recording() as events:
            for c in range(2):
                hidden, residual = _step_inputs(run, s, layer_idx)
                hidden = chain.padded(hidden, real)
                residual = None if residual is None else chain.padded(residual, real)
                envs.append(chain.run_layer(
                    layer, backend="kernels", hidden=hidden.to(devices.current().torch_device),
                    residual=None if residual is None else residual.to(devices.current().torch_device),
                    weights=dev_weights, batch=_to_dev(batch), cache=caches[c], layer_idx=layer_idx, real=real,
                    order_seed=None if c == 0 else checks.seed_of("layer-order", s), prepared=prepared,
                    local=c == 0, around_step=functools.partial(_timed, seconds) if c == 0 else None))
                kin[c] = (envs[c][layer.outputs["hidden"]].cpu(), envs[c][layer.outputs["residual"]].cpu())
        assert compile_watch.serving_compiles(events) == []
        hidden, residual = _step_inputs(run, s, layer_idx)
        ref_env = chain.run_layer(layer, backend="reference", hidden=hidden[:real],
                                  residual=None if residual is None else residual[:real], weights=weights,
                                  batch=ref_layer.real_batch(batch, real), cache=ref_cache, layer_idx=layer_idx)
        rin = (ref_env[layer.outputs["hidden"]], ref_env[layer.outputs["residual"]])

        steps = layer.first_steps if layer_idx == 0 else layer.steps
        print(f"\nlayer {layer_idx} (window {chain.layer_constants(layer, layer_idx)['sliding_window']}) "
              f"decode step {s}: {real} real rows of {LAYER_TOKENS}, contexts {[c + s for c in LAYER_CONTEXTS]}")
        failures += _check_steps(steps, envs, ref_env, caches, ref_cache, batch, real, s, seconds)
        # the next layer's residual add (+ RMSNorm to MXFP8) on this layer's outputs, in both chains
        nxt = layer.steps[0]
        next_op = OPS[chain.discovery.discover()[nxt.kernel].entries[nxt.entry]]
        k_next = chain.run_layer(layer, backend="kernels", hidden=chain.padded(kin[0][0], real).to(dev),
                                 residual=chain.padded(kin[0][1], real).to(dev), weights=dev_weights, batch={},
                                 cache={}, layer_idx=layer_idx + 1, real=real, prepared=prepared, local=True, upto=1)
        r_next = chain.run_layer(layer, backend="reference", hidden=rin[0], residual=rin[1], weights=weights,
                                 batch={}, cache={}, layer_idx=layer_idx + 1, upto=1)
        got, local, want = (_step_floats(nxt, k_next, real, ""), _step_floats(nxt, k_next, None, "local:"),
                            _step_floats(nxt, r_next, None, ""))
        for name in got:
            lc, cc = cosine(got[name], local[name]), cosine(got[name], want[name])
            print(f"  {'next norm':10s} {name:14s} own-inputs {lc:.7f} (>= {next_op.cosine_min})  chain {cc:.7f}")
            if not lc >= next_op.cosine_min:
                failures.append(f"step {s} next layer's {nxt.name}.{name}: cosine {lc:.7f} on its own inputs")
        failures += _check_drift(layer, envs[0], ref_env, weights, LAYER_BOUND[layer_idx], f"step {s}", real=real)
    print("warm-up s: " + ", ".join(f"{k} {v:.2f}" for k, v in warm.items()))
    assert failures == []


@contextlib.contextmanager
def _timed(seconds: dict, step):
    start = time.perf_counter()
    yield
    seconds[step.name] = time.perf_counter() - start


def _slots(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    return cache.view(-1, ref_layer.KV_HEADS, ref_layer.HEAD_DIM)[slots].float()


# The kernel chain's MoE step (the routed entry) routes in its first launch with the route entry's own logit
# chain, bit for bit (harness/test_moe_routed.py), and outputs no ids: its experts are the route kernel's on the
# chain's MoE input (rows on their own: the router is batch invariant).
ROUTER = ("moe/route_h2880_e128_top4", "route")


def _kernel_expert_ids(env: dict, weights: dict, rows) -> torch.Tensor:
    dev = devices.current().torch_device
    x = env["mlp_norm.out"].detach().cpu()[rows].contiguous()
    route = chain._entry(*ROUTER)[1]
    route.warm_up()  # (loaded from the disk cache once per process)
    _, ids = route(x.to(dev), weights["router_weight"].to(dev), weights["router_bias"].to(dev), ref_layer.TOP_K)
    return ids.cpu()


def _check_drift(layer, got: dict, ref_env: dict, weights: dict, bounds: dict, where: str, real: int | None = None,
                 rows: list | None = None) -> list:
    """The layer output (on the rows that kept the reference chain's experts) and the residual within the
    derived bounds, every expert swap explained; over `rows` when given (a prefill chain's sampled rows), else
    the first `real` (None: all)."""
    sel = slice(None, real) if rows is None else torch.tensor(rows, dtype=torch.long)
    got_ids = _kernel_expert_ids(got, weights, sel)
    drift = layer_bound.chain_drift(layer, got, ref_env, weights, real=real, rows=rows, ids_a=got_ids)
    flips = layer_bound.unexplained_flips(got["mlp_norm.out"].detach().cpu()[sel], ref_env["mlp_norm.out"][sel],
                                          got_ids, layer_bound.expert_ids(ref_env, weights, sel),
                                          weights["router_weight"], weights["router_bias"])
    agree = drift["agree"]
    print(f"  layer output cosine {1 - drift['output']:.7f} on the {int(agree.sum())} of {agree.numel()}"
          f"{' sampled' if rows is not None else ''} rows with the reference chain's experts "
          f"(>= {1 - bounds['output']:.7f}), residual {1 - drift['residual']:.7f} (>= {1 - bounds['residual']:.7f})")
    failures = [f"{where}: {f}" for f in flips]
    if not agree.any():
        failures.append(f"{where}: no row kept the reference chain's experts")
    elif not drift["output"] <= bounds["output"]:
        failures.append(f"{where}: layer output 1 - cosine {drift['output']:.3e} > {bounds['output']:.3e}")
    if not drift["residual"] <= bounds["residual"]:
        failures.append(f"{where}: residual 1 - cosine {drift['residual']:.3e} > {bounds['residual']:.3e}")
    return failures


def _check_steps(steps, envs, ref_env, caches, ref_cache, batch, real: int, s: int, seconds: dict,
                 pick=None, whole=()) -> list:
    """One chain step s of a layer: each op's outputs bitwise equal in the two kernel chains, their cosine on the
    op's own inputs (>= the op's bound) and along the chain (printed), the cache slots the rope step wrote, and
    the two chains' caches bitwise equal. pick: the sampled rows (chunked prefill) of the ops not in `whole`;
    None: every real row."""
    failures = []
    for st in steps:
        sampled = pick is not None and st.name not in whole
        sel, n = (pick, len(pick)) if sampled else (slice(None, real), real)
        for o in st.outputs:
            key = f"{st.name}.{o}"
            a, b = envs[0][key].detach().cpu()[sel], envs[1][key].detach().cpu()[sel]
            if not checks.same_rows(a, b, torch.ones(n, dtype=torch.bool)):
                failures.append(f"step {s} {key}: two kernel chains differ")
        got = {k: v[sel] for k, v in _step_floats(st, envs[0], real, "").items()}
        local = {k: v[sel] for k, v in _step_floats(st, envs[0], None, "local:").items()}
        want = {k: v[sel] for k, v in _step_floats(st, ref_env, None, "").items()}
        op = OPS[chain.discovery.discover()[st.kernel].entries[st.entry]]
        for name in got:
            lc, cc = cosine(got[name], local[name]), cosine(got[name], want[name])
            print(f"  {st.name:10s} {name:14s} own-inputs {lc:.7f} (>= {op.cosine_min})  chain {cc:.7f}"
                  f"  ({'sampled' if sampled else 'all'} rows, {seconds[st.name]:.1f} s)")
            if not lc >= op.cosine_min:
                failures.append(f"step {s} {st.name}.{name}: cosine {lc:.7f} on its own inputs < {op.cosine_min}")
        for m in op.mutates:  # the cache slots this step wrote, against the reference's writes
            name = {"key_cache": "key", "value_cache": "value"}[m]
            live = batch["slot_mapping"][:real]
            g = _slots(caches[0][name].cpu(), live)
            lc = cosine(g, _slots(envs[0][f"local:{st.name}.{m}"], live))
            cc = cosine(g, _slots(ref_cache[name], live))
            print(f"  {st.name:10s} {name + ' written':14s} own-inputs {lc:.7f} (>= {op.cosine_min})  chain {cc:.7f}")
            if not lc >= op.cosine_min:
                failures.append(f"step {s} cache.{name}: written slots cosine {lc:.7f} < {op.cosine_min}")
    for name in ("key", "value"):
        if not torch.equal(caches[0][name].cpu().view(torch.uint8), caches[1][name].cpu().view(torch.uint8)):
            failures.append(f"step {s} cache.{name}: two kernel chains differ")
    return failures


def _step_floats(st, env: dict, real: int | None, prefix: str) -> dict:
    """A step's compared results as fp32 (the op's to_float: MXFP8 dequantized, routing dense), plus the
    outputs to_float does not cover (the fused norms' residual)."""
    op = OPS[chain.discovery.discover()[st.kernel].entries[st.entry]]
    outs = tuple(env[f"{prefix}{st.name}.{o}"].detach().cpu()[slice(None, real)] for o in st.outputs)
    floats = dict(zip(op.result_names, op.to_float(outs)))
    if "residual" in st.outputs and "residual" not in floats:
        floats["residual"] = env[f"{prefix}{st.name}.residual"].detach().cpu()[slice(None, real)].float()
    return floats

