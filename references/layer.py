"""One gpt-oss-120b decoder layer (TP1), composed from the per-op references only: no numerics of its own.

decoder_layer(hidden, residual, weights, batch, key_cache, value_cache, layer_idx) -> (hidden, residual)
calls, in vLLM's order (vllm/model_executor/models/gpt_oss.py; the step-by-step map is kernels/LAYER.md):
  norm.fused_add_rmsnorm_mxfp8 (norm.rmsnorm_mxfp8 with the input as residual when `residual` is None: the
  first layer) -> gemm.mxfp8_gemm (QKV, bias) -> attention.rope_kv_write (writes key_cache / value_cache in
  place) -> attention.paged_attention (128-key window on even layers, full on odd) -> gemm.mxfp8_quant ->
  gemm.mxfp8_gemm (O, bias) -> norm.fused_add_rmsnorm (bf16: the router and the MoE take bf16) ->
  moe.moe_route_softmax_topk -> moe.moe_mxfp4_gptoss; returns (MoE output, residual stream), which the next
  layer's first norm adds. Every rounding point, layout and tolerance is that of the op's own reference;
  each op consumes the previous op's outputs as they are (the attention output [T, 64, 64] is viewed as
  [T, 4096]). The harness runs the same chain from its declaration in regimes/gpt_oss_120b.toml
  ([[layer]]) on the references and on the kernels; harness/test_layer.py checks that the declared chain on
  the references gives this function's bits.

Weights (`build_layer_weights`): the checkpoint's formats at the real dims, seeded:
  attn_norm, mlp_norm bf16 [2880] ~ N(1, 0.25);
  qkv float8_e4m3fn [5120, 2880] + qkv_scales uint8 [5120, 90] = MXFP8(N(0, 0.02)), qkv_bias bf16 [5120]
  ~ N(0, 0.1); o [2880, 4096] + o_scales [2880, 128] likewise, o_bias bf16 [2880];
  sinks fp32 [64] (bf16 values, as the checkpoint stores them) ~ N(0, 2);
  cos_sin_cache fp32 [131072, 64]: the YaRN table (references.attention.build_cos_sin_cache);
  router_weight bf16 [128, 2880] ~ N(0, 1/2880), router_bias bf16 [128] ~ N(0, 0.25);
  w13_blocks, w13_scales, w13_bias, w2_blocks, w2_scales, w2_bias: MXFP4 experts in the checkpoint layout
  (references.moe's expert weights, the MoE checks' model).

Decode batches (`build_decode_run`): B real sequences with context lengths `contexts` (keys already in the
cache) run `steps` decode steps at a capture size T >= B; step s writes the key/value of position
contexts[b] + s, which steps s+1.. attend to. The cache holds each sequence's prior keys ~ N(0, 1) in
shuffled blocks (references.attention.build_paged_attention_inputs, every block live) and NaN in every slot
a step will write (a missed write shows). Padding rows: position 0, slot -1, q_len 0 and seq_len 0, as vLLM
pads a CUDA-graph batch.
"""

from __future__ import annotations

import functools

import torch

from references import attention, gemm, moe, norm
from references.mx import mxfp8_quantize

HIDDEN = 2880
QUERY_HEADS, KV_HEADS, HEAD_DIM = attention.HEADS[1][0], attention.HEADS[1][1], attention.HEAD_DIM
EXPERTS, TOP_K, INTERMEDIATE = 128, 4, 2880
EPS = 1e-5
WINDOW = 128  # even layers


def sliding_window(layer_idx: int) -> int:
    """vLLM's gpt-oss: `sliding_window if layer_idx % 2 == 0 else None`."""
    return WINDOW if layer_idx % 2 == 0 else 0


@functools.lru_cache(maxsize=2)
def build_layer_weights(seed: int) -> dict:
    """One layer's weights in checkpoint formats (see the module docstring); cached (the experts are 1.6 GB)."""
    gen = torch.Generator().manual_seed(seed)
    qkv_n = (QUERY_HEADS + 2 * KV_HEADS) * HEAD_DIM
    o_k = QUERY_HEADS * HEAD_DIM

    def gain(n):
        return (1.0 + 0.25 * torch.randn(n, generator=gen)).to(torch.bfloat16)

    def mx_linear(n, k):
        w, s = mxfp8_quantize(0.02 * torch.randn(n, k, generator=gen))
        return w, s, (0.1 * torch.randn(n, generator=gen)).to(torch.bfloat16)

    w = {"attn_norm": gain(HIDDEN)}
    w["qkv"], w["qkv_scales"], w["qkv_bias"] = mx_linear(qkv_n, HIDDEN)
    w["sinks"] = (2.0 * torch.randn(QUERY_HEADS, generator=gen)).to(torch.bfloat16).float()
    w["o"], w["o_scales"], w["o_bias"] = mx_linear(HIDDEN, o_k)
    w["mlp_norm"] = gain(HIDDEN)
    w["router_weight"] = (torch.randn(EXPERTS, HIDDEN, generator=gen) / HIDDEN**0.5).to(torch.bfloat16)
    w["router_bias"] = (0.25 * torch.randn(EXPERTS, generator=gen)).to(torch.bfloat16)
    w["cos_sin_cache"] = attention.build_cos_sin_cache()
    w.update(moe._weights(HIDDEN, INTERMEDIATE, EXPERTS, True, 1000 + HIDDEN + INTERMEDIATE + EXPERTS))
    return w


def build_decode_run(tokens: int, contexts: list[int], steps: int, seed: int) -> dict:
    """A decode run of `steps` steps over len(contexts) real sequences at capture size `tokens`.

    -> {"hidden", "residual": bf16 [tokens, 2880] step 0's inputs (x ~ N(0, 1), residual ~ N(0, 4) with 1%
    outlier channels at 30x: references.norm's builder; padding rows filled by the caller),
    "key_cache", "value_cache": bf16 [num_blocks, 64, 8, 64], "batches": one dict per step (positions,
    slot_mapping int64 [tokens]; cu_seqlens_q int32 [tokens + 1]; seq_lens int32 [tokens]; block_table int32
    [tokens, max_blocks]), "real": len(contexts)}."""
    real = len(contexts)
    if not 0 < real <= tokens or steps < 1 or min(contexts) < 0:
        raise ValueError(f"contexts {contexts} / steps {steps} do not fit {tokens} rows")
    final = [c + steps for c in contexts] + [1] * (tokens - real)  # padding sequences: dropped below
    dims = {"query_heads": QUERY_HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM, "sliding_window": 0}
    built = attention.build_paged_attention_inputs(tokens, dims, seed, seq_lens=final)
    kc, vc, table = built["key_cache"], built["value_cache"], built["block_table"]
    batches = []
    for s in range(steps):
        pos = torch.zeros(tokens, dtype=torch.int64)
        slot = torch.full((tokens,), -1, dtype=torch.int64)
        lens = torch.zeros(tokens, dtype=torch.int32)
        for b, c in enumerate(contexts):
            p = c + s
            pos[b] = p
            slot[b] = int(table[b, p // attention.BLOCK_SIZE]) * attention.BLOCK_SIZE + p % attention.BLOCK_SIZE
            lens[b] = p + 1
        cu = torch.arange(tokens + 1, dtype=torch.int32).clamp(max=real)
        batches.append({"positions": pos, "slot_mapping": slot, "cu_seqlens_q": cu, "seq_lens": lens,
                        "block_table": table})
    for batch in batches:  # every slot a step writes starts as NaN
        live = batch["slot_mapping"][:real]
        for cache in (kc, vc):
            cache.view(-1, KV_HEADS, HEAD_DIM)[live] = float("nan")
    x = norm.build_inputs(tokens, {"hidden": HIDDEN, "eps": EPS}, seed, with_residual=True)
    return {"hidden": x["x"], "residual": x["residual"], "key_cache": kc, "value_cache": vc,
            "batches": batches, "real": real}


def real_batch(batch: dict, real: int) -> dict:
    """The step metadata of the real sequences only (what the references run on)."""
    return {"positions": batch["positions"][:real], "slot_mapping": batch["slot_mapping"][:real],
            "cu_seqlens_q": batch["cu_seqlens_q"][:real + 1], "seq_lens": batch["seq_lens"][:real],
            "block_table": batch["block_table"][:real]}


def decoder_layer(hidden: torch.Tensor, residual: torch.Tensor | None, weights: dict, batch: dict,
                  key_cache: torch.Tensor, value_cache: torch.Tensor, layer_idx: int
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """One decoder layer on the references (caches written in place) -> (hidden, residual) bf16 [T, 2880]."""
    w = weights
    if residual is None:
        q, s = norm.rmsnorm_mxfp8(hidden, w["attn_norm"], EPS)
        residual = hidden
    else:
        q, s, residual = norm.fused_add_rmsnorm_mxfp8(hidden, residual, w["attn_norm"], EPS)
    (qkv,) = gemm.mxfp8_gemm(q, s, w["qkv"], w["qkv_scales"], w["qkv_bias"])
    (qr,) = attention.rope_kv_write(qkv, batch["positions"], w["cos_sin_cache"], batch["slot_mapping"],
                                    key_cache, value_cache)
    (att,) = attention.paged_attention(qr, key_cache, value_cache, batch["cu_seqlens_q"], batch["seq_lens"],
                                       batch["block_table"], w["sinks"], sliding_window(layer_idx))
    q, s = gemm.mxfp8_quant(att.reshape(att.shape[0], -1))
    (o,) = gemm.mxfp8_gemm(q, s, w["o"], w["o_scales"], w["o_bias"])
    h, residual = norm.fused_add_rmsnorm(o, residual, w["mlp_norm"], EPS)
    topk_weights, topk_ids = moe.moe_route_softmax_topk(h, w["router_weight"], w["router_bias"], TOP_K)
    (out,) = moe.moe_mxfp4_gptoss(h, topk_weights, topk_ids, w["w13_blocks"], w["w13_scales"], w["w13_bias"],
                                  w["w2_blocks"], w["w2_scales"], w["w2_bias"])
    return out, residual
