"""Host code of the MXFP4 MoE packages moe/mxfp4_h<H>_i<I>_e<E>_top<k> (the family's device code is the
package mxfp4_moe/, one module per launch): checks, workspace, the variant table and the torch custom op.

The entry takes the prepared weights (kernels/moe/prepare.py, run once at load time); `prepare_inputs`
maps a reference's inputs (checkpoint layout) to the entry's, for the harness. A package given its router
(`route`: the route package's launcher variant) also gets `routed`: from the hidden states and the router's
weight and bias (what vLLM's FusedMoE layer receives), below its prefill threshold 3 launches in all
(mxfp4_moe/fused.py: router + quant + sort, gate-up, down + combine), from it 4 (router + quant + the
super-tile sort, then the prefill tier's gate-up, down, combine), the same bits as route + moe.

(No `from __future__ import annotations`: torch.library reads the entries' annotations as types.)
"""

import weakref
from functools import partial
from types import SimpleNamespace

import torch

from amd_kernels import host, warm_up
from amd_kernels.moe import mxfp4_moe, prepare

ROUTE_KEY = "route.all"  # the router's variant in the table of a package with a `routed` entry
WEIGHTS = ("w13", "w13_scale", "w13_bias", "w2", "w2_scale", "w2_bias", "shard")

# prepare_inputs' cache, one entry for every MoE package: (package, id of w13_blocks, tp_rank), a weak
# reference to that checkpoint tensor, its prepared weights. It holds no checkpoint alive and is emptied when
# its checkpoint is freed, so it never keeps more than one layer's prepared weights (1.7 GB at TP1).
_last: list = []


def _prepared(package: str, inputs: dict, prepare):
    w = inputs["w13_blocks"]
    key = (package, id(w), inputs.get("tp_rank", 0))
    if _last and _last[0][0] == key and _last[0][1]() is w:
        return _last[0][2]
    _last.clear()  # the previous weights go before the new ones are made

    def forget(ref):
        if _last and _last[0][1] is ref:
            _last.clear()

    weights = prepare()
    _last.append((key, weakref.ref(w, forget), weights))
    return weights


def build(package: str, *, hidden: int, intermediate: int, experts: int, top_k: int, activation: str,
          tp_size: int = 1, small_m_waves: int = 0, prefill_from: int = 0, prefill128_from: int = 0,
          kernel=mxfp4_moe, route=None, routed_prefill_from: int | None = None):
    """The entry of the package `package` (its `__name__`): `intermediate` is the model's (unsharded) size,
    `tp_size` the ranks it is cut over (vLLM's cut, prepare.py), `small_m_waves` > 0 adds a small-M variant
    (mxfp4_moe.build). `kernel`: the pipeline's device code (the family's mxfp4_moe, or a shape's own copy).
    `route`: None, or the router's (launcher, example_args) for this hidden size, expert count and top-k
    (route.variants), which adds the `routed` entry (its variants "route.all", for the prefill tier, and the
    pipeline's "fused.*" join this package's table). `routed_prefill_from`: the token count from which the
    routed entry takes the prefill tier (default prefill_from; its decode launches fold the combine into down,
    so its threshold can lie above the moe entry's)."""
    if routed_prefill_from is None:
        routed_prefill_from = prefill_from
    if not isinstance(routed_prefill_from, int) or routed_prefill_from < 0:
        raise ValueError(f"routed_prefill_from: a token count >= 0 (0: never), got {routed_prefill_from!r}")
    shape_token = host.shape_token(package)
    ip = prepare.padded_intermediate(intermediate, tp_size)
    # variants, variant_for, max_tokens, launch_args, weight_shapes, weight_dtypes, emulator_workgroups
    pipeline = kernel.build(hidden, ip, experts, top_k, activation, f"moe_{shape_token}",
                            small_m_waves=small_m_waves, prefill_from=prefill_from,
                            prefill128_from=prefill128_from)
    prepare_weights = partial(prepare.prepare_weights, activation=activation, hidden=hidden,
                              intermediate=intermediate, experts=experts, tp_size=tp_size)
    variants = dict(pipeline.variants)
    if route is not None:
        variants[ROUTE_KEY] = route
        variants.update(pipeline.fused_variants)
    table = warm_up.VariantTable(package, {k: warm_up.Variant(*v) for k, v in variants.items()})
    # One mode: M is a runtime argument of every variant; the small_m variant serves the smallest M.
    modes = {"all": sorted(pipeline.variants)}
    shapes = pipeline.weight_shapes()

    def check_weights(x, given):
        for name in WEIGHTS:  # a checkpoint-layout tensor has another shape: "not prepared" names it
            hint = ("pass every output of prepare_weights() (made once at load time)" if name == "shard" else
                    "a checkpoint-layout weight? pass it through prepare_weights() once at load time")
            host.check_tensor(name, given[name], dtype=pipeline.weight_dtypes[name], shape=shapes[name], like=x,
                              hint=hint)

    def launch_moe(x, topk_weights, topk_ids, given, out):
        m = x.shape[0]
        if m:
            key = pipeline.variant_for(m)
            table[key](*pipeline.launch_args(key, x, topk_weights, topk_ids, given, out, x.device),
                       host.stream_of(x))

    def outputs(x, topk_weights, topk_ids, w13, w13_scale, w13_bias, w2, w2_scale, w2_bias, shard):
        """The checks and the output, shared by the entry and its fake (host.custom_op)."""
        if isinstance(x, torch.Tensor) and x.dim() and x.shape[0] > pipeline.max_tokens:
            raise ValueError(f"x: {x.shape[0]} tokens, more than this MoE's limit of {pipeline.max_tokens} per call "
                             f"(its per-pair buffers would pass the 2 GiB its 32-bit offsets reach); split the batch")
        host.check_tensor("x", x, dtype=torch.bfloat16, shape=(None, hidden))
        m = x.shape[0]
        host.check_tensor("topk_weights", topk_weights, dtype=torch.float32, shape=(m, top_k), like=x)
        host.check_tensor("topk_ids", topk_ids, dtype=torch.int32, shape=(m, top_k), like=x)
        check_weights(x, dict(w13=w13, w13_scale=w13_scale, w13_bias=w13_bias, w2=w2, w2_scale=w2_scale,
                              w2_bias=w2_bias, shard=shard))
        return torch.empty_like(x)

    @warm_up.entry(table, modes, lambda *a, **k: "all")
    def moe(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, w13: torch.Tensor,
            w13_scale: torch.Tensor, w13_bias: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor,
            w2_bias: torch.Tensor, shard: torch.Tensor) -> torch.Tensor:
        out = outputs(x, topk_weights, topk_ids, w13, w13_scale, w13_bias, w2, w2_scale, w2_bias, shard)
        launch_moe(x, topk_weights, topk_ids, dict(w13=w13, w13_scale=w13_scale, w13_bias=w13_bias, w2=w2,
                                                  w2_scale=w2_scale, w2_bias=w2_bias, shard=shard), out)
        return out

    def prepare_inputs(inputs: dict) -> dict:
        """Reference inputs (checkpoint layout) -> entry inputs; the prepared weights are cached for the last
        checkpoint tensor object (a model prepares them once at load time)."""
        if inputs.get("tp_size", 1) != tp_size:
            raise ValueError(f"tp_size: this package serves tp_size {tp_size}, got {inputs.get('tp_size', 1)}")
        weights = _prepared(package, inputs, lambda: prepare_weights(
            inputs["w13_blocks"], inputs["w13_scales"], inputs.get("w13_bias"), inputs["w2_blocks"],
            inputs["w2_scales"], inputs.get("w2_bias"), tp_rank=inputs.get("tp_rank", 0)))
        return {"x": inputs["x"], "topk_weights": inputs["topk_weights"], "topk_ids": inputs["topk_ids"], **weights}

    op = host.custom_op(f"amd_kernels::{shape_token}_moe", moe, outputs)
    op.max_tokens = pipeline.max_tokens
    built = SimpleNamespace(VARIANTS=table, PIPELINE=pipeline, moe=op, prepare_weights=prepare_weights,
                            prepare_inputs=prepare_inputs, emulator_workgroups=pipeline.emulator_workgroups)
    if route is None:
        return built

    # The router's i32 byte offsets into x [M, hidden] bf16 bound M too.
    routed_max_tokens = min(pipeline.max_tokens, host.max_tokens_for(hidden * 2))
    # The routed variant of a token count (mxfp4_moe/fused.py: the router in the first launch; at decode sizes
    # the combine folded into down; same bits). A shape without fused launches runs the router's launch, then
    # the MoE's as `moe` does.
    fused_key = {k: (k.replace("moe.", "fused.", 1) if k.replace("moe.", "fused.", 1) in pipeline.fused_variants
                     else k) for k in pipeline.variants}
    routed_modes = {mode: [ROUTE_KEY, *(fused_key[k] for k in keys)] for mode, keys in modes.items()}

    def routed_outputs(x, router_weight, router_bias, w13, w13_scale, w13_bias, w2, w2_scale, w2_bias, shard):
        """The checks and the output, shared by the routed entry and its fake (host.custom_op)."""
        host.check_tokens("x", x, routed_max_tokens)
        host.check_tensor("x", x, dtype=torch.bfloat16, shape=(None, hidden))
        host.check_tensor("router_weight", router_weight, dtype=torch.bfloat16, shape=(experts, hidden), like=x)
        host.check_tensor("router_bias", router_bias, dtype=torch.bfloat16, shape=(experts,), like=x)
        check_weights(x, dict(w13=w13, w13_scale=w13_scale, w13_bias=w13_bias, w2=w2, w2_scale=w2_scale,
                              w2_bias=w2_bias, shard=shard))
        return torch.empty_like(x)

    @warm_up.entry(table, routed_modes, lambda *a, **k: "all")
    def routed(x: torch.Tensor, router_weight: torch.Tensor, router_bias: torch.Tensor, w13: torch.Tensor,
               w13_scale: torch.Tensor, w13_bias: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor,
               w2_bias: torch.Tensor, shard: torch.Tensor) -> torch.Tensor:
        out = routed_outputs(x, router_weight, router_bias, w13, w13_scale, w13_bias, w2, w2_scale, w2_bias, shard)
        m = x.shape[0]
        if m:
            stream = host.stream_of(x)
            key = fused_key[pipeline.variant_for(m, routed_prefill_from)]
            given = dict(w13=w13, w13_scale=w13_scale, w13_bias=w13_bias, w2=w2, w2_scale=w2_scale, w2_bias=w2_bias,
                         shard=shard)
            if key in pipeline.fused_variants:  # the router in the first launch (3 at decode sizes, 4 prefill)
                table[key](*pipeline.fused_launch_args(key, x, router_weight, router_bias, given, out, x.device),
                           stream)
            else:  # no fused launches for this shape: the router's launch, then the MoE's
                topk_weights = torch.empty((m, top_k), dtype=torch.float32, device=x.device)
                topk_ids = torch.empty((m, top_k), dtype=torch.int32, device=x.device)
                table[ROUTE_KEY](x, router_weight, router_bias, topk_weights, topk_ids, m, stream)
                table[key](*pipeline.launch_args(key, x, topk_weights, topk_ids, given, out, x.device), stream)
        return out

    def prepare_routed_inputs(inputs: dict) -> dict:
        """moe_routed_mxfp4_gptoss's reference inputs -> the routed entry's (prepared weights, as prepare_inputs;
        top_k is this package's)."""
        if inputs.get("top_k", top_k) != top_k:
            raise ValueError(f"top_k: this package selects {top_k} experts, got {inputs['top_k']}")
        moe_in = prepare_inputs({**inputs, "topk_weights": None, "topk_ids": None})
        return {"x": inputs["x"], "router_weight": inputs["router_weight"], "router_bias": inputs["router_bias"],
                **{k: moe_in[k] for k in WEIGHTS}}

    routed_op = host.custom_op(f"amd_kernels::{shape_token}_routed", routed, routed_outputs)
    routed_op.max_tokens = routed_max_tokens
    built.routed = routed_op
    built.routed_prefill_from = routed_prefill_from
    built.prepare_routed_inputs = prepare_routed_inputs
    return built
