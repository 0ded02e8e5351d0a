"""Host code of the MXFP4 MoE packages: checks, workspace, the variant table and the torch custom op.

The entry takes the prepared weights (kernels/moe/prepare.py, run once at load time); `prepare_inputs`
maps a reference's inputs (checkpoint layout) to the entry's, for the harness.

(No `from __future__ import annotations`: torch.library reads the entries' annotations as types.)
"""

import weakref
from types import SimpleNamespace

import torch

from amd_kernels import host, warm_up

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


def build(package: str, shape_token: str, *, hidden: int, experts: int, top_k: int, pipeline, prepare_weights,
          tp_size: int = 1):
    """`pipeline`: what mxfp4_moe.build returns (variants, variant_for, max_tokens, launch_args,
    weight_shapes, weight_dtypes); `prepare_weights`: the package's (prepare.prepare_weights with its shape)."""
    table = warm_up.VariantTable(package, {k: warm_up.Variant(*v) for k, v in pipeline.variants.items()})
    # One mode: M is a runtime argument of every variant; the small_m variant serves the smallest M.
    modes = {"all": sorted(pipeline.variants)}
    shapes = pipeline.weight_shapes()

    def outputs(x, topk_weights, topk_ids, w13, w13_scale, w13_bias, w2, w2_scale, w2_bias, shard):
        """The checks and the output, shared by the entry and its fake (host.custom_op)."""
        if isinstance(x, torch.Tensor) and x.dim() and x.shape[0] > pipeline.max_tokens:
            raise ValueError(f"x: {x.shape[0]} tokens, more than this MoE's limit of {pipeline.max_tokens} per call "
                             f"(its per-pair buffers would pass the 2 GiB its 32-bit offsets reach); split the batch")
        host.check_tensor("x", x, dtype=torch.bfloat16, shape=(None, hidden))
        m = x.shape[0]
        host.check_tensor("topk_weights", topk_weights, dtype=torch.float32, shape=(m, top_k), like=x)
        host.check_tensor("topk_ids", topk_ids, dtype=torch.int32, shape=(m, top_k), like=x)
        given = dict(w13=w13, w13_scale=w13_scale, w13_bias=w13_bias, w2=w2, w2_scale=w2_scale, w2_bias=w2_bias,
                     shard=shard)
        for name in WEIGHTS:  # a checkpoint-layout tensor has another shape: "not prepared" names it
            hint = ("pass every output of prepare_weights() (made once at load time)" if name == "shard" else
                    "a checkpoint-layout weight? pass it through prepare_weights() once at load time")
            host.check_tensor(name, given[name], dtype=pipeline.weight_dtypes[name], shape=shapes[name], like=x,
                              hint=hint)
        return torch.empty_like(x)

    @warm_up.entry(table, modes, lambda *a, **k: "all")
    def moe(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, w13: torch.Tensor,
            w13_scale: torch.Tensor, w13_bias: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor,
            w2_bias: torch.Tensor, shard: torch.Tensor) -> torch.Tensor:
        out = outputs(x, topk_weights, topk_ids, w13, w13_scale, w13_bias, w2, w2_scale, w2_bias, shard)
        m = x.shape[0]
        given = dict(w13=w13, w13_scale=w13_scale, w13_bias=w13_bias, w2=w2, w2_scale=w2_scale, w2_bias=w2_bias,
                     shard=shard)
        if m:
            key = pipeline.variant_for(m)
            table[key](*pipeline.launch_args(key, x, topk_weights, topk_ids, given, out, x.device),
                       host.stream_of(x))
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
    return SimpleNamespace(VARIANTS=table, moe=op,
                           prepare_inputs=prepare_inputs, emulator_workgroups=pipeline.emulator_workgroups)
