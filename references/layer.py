"""One gpt-oss-120b decoder layer (TP1; TP8 shards at the end) from the per-op references only: no numerics of its own.

decoder_layer(hidden, residual, weights, batch, key_cache, value_cache, layer_idx) -> (hidden, residual)
calls, in vLLM's order (vllm/model_executor/models/gpt_oss.py; the step-by-step map is kernels/LAYER.md):
  norm.fused_add_rmsnorm_mxfp8 (norm.rmsnorm_mxfp8 with the input as residual when `residual` is None: the
  first layer) -> gemm.mxfp8_gemm (QKV, bias) -> attention.rope_kv_write (writes key_cache / value_cache in
  place) -> attention.paged_attention (128-key window on even layers, full on odd) -> gemm.mxfp8_quant ->
  gemm.mxfp8_gemm (O, bias) -> norm.fused_add_rmsnorm (bf16: the router and the MoE take bf16) ->
  moe.moe_route_softmax_topk -> moe.moe_mxfp4_gptoss (the chain's one `moe` step: the MoE package's routed
  entry, whose reference moe.moe_routed_mxfp4_gptoss is exactly these two); returns (MoE output, residual
  stream), which the next layer's first norm adds. Every rounding point, layout and tolerance is that of the op's own reference;
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
  (references.moe's expert weights, the MoE checks' model; the uint8 ones as references.moe.LazyExperts,
  regenerated where read, the same bytes as the eager builder's).

Chain bound (what a kernel chain must reach against this reference chain; harness/test_layer.py asserts it,
harness/layer_bound.py derives it). Each kernel is held to its op's tolerance on its own inputs; along the
chain the kernel chain and this reference chain part where a kernel rounds where its reference does not, and
every later MXFP8 quantization (the O projection's input, the MoE's input and intermediate) turns a last-bit
input change into whole E4M3 steps on some codes. The decode chain's one such rounding point is the
attention's P rounded to bf16 before P V (references.attention.paged_attention_p_bf16 puts it back in the
reference; every other kernel matches its reference to cosine 1.0000000 on its own inputs); at TP8 also the
O projection's and the MoE's per-rank partials rounded to bf16 and summed in rank order (run_layer_ranks
composes them from the same references). The bound on 1 - cosine is max + 3 std over seeds of that modelled
chain against this one (harness/layer_bound.py prints the samples), separately for the layer output (over
the rows whose experts both chains chose alike) and the residual stream. A rounding may swap two near-tied
experts: the router's top-k is discontinuous, so a swapped row's output has no cosine bound; instead the
swap must be explained by the router inputs' difference (|logit gap| <= the two logits' moves under that
difference plus one bf16 ulp each, exact per row: harness/layer_bound.unexplained_flips).

Decode batches (`build_decode_run`): B real sequences with context lengths `contexts` (keys already in the
cache) run `steps` decode steps at a capture size T >= B; step s writes the key/value of position
contexts[b] + s, which steps s+1.. attend to. The cache holds each sequence's prior keys ~ N(0, 1) in
shuffled blocks (references.attention.build_paged_attention_inputs, every block live) and NaN in every slot
a step will write (a missed write shows). Padding rows: position 0, slot -1, q_len 0 and seq_len 0, as vLLM
pads a CUDA-graph batch.

Chunked-prefill batches (`build_prefill_run`): each sequence has a cached prefix (keys already in the cache)
and a query length per step (1: a decode token; > 1: a prefill chunk, its rows back to back at positions
prefix + earlier steps' rows ..); step s writes every row's key/value, which its own later rows (causal) and
the steps after it attend to (a prompt in two chunks: the second chunk reads the first from the cache). A
step's rows are padded to the next capture size (vLLM's 1, 2, 4, 8k) with one padding sequence (q_len 0,
seq_len 0) owning no row; padding rows have position 0 and slot -1. Each step has its own layer inputs
(norm's builder, seeded per step: the hidden states of the step's tokens).
"""

from __future__ import annotations

import functools
import gc

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
    """One layer's weights in checkpoint formats (see the module docstring); cached. The experts are
    references.moe's lazy checkpoint (LazyExperts: the MoE builder's bytes, regenerated where read), so a
    layer's weights hold ~64 MB, not the experts' 1.7 GB beside the MoE package's prepared copy."""
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
    w.update(moe._lazy_weights(HIDDEN, INTERMEDIATE, EXPERTS, True, 1000 + HIDDEN + INTERMEDIATE + EXPERTS))
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


def capture_size(rows: int) -> int:
    """vLLM's CUDA-graph capture size for `rows` tokens: 1, 2, 4, then the next multiple of 8."""
    return rows if rows <= 2 else 4 if rows <= 4 else -(-rows // 8) * 8


def build_prefill_run(prefixes: list[int], q_lens: list[list[int]], seed: int) -> dict:
    """A chunked-prefill run: sequence b has prefixes[b] cached keys and q_lens[b][s] query rows at step s
    (module docstring). -> {"key_cache", "value_cache": bf16 [num_blocks, 64, 8, 64] (NaN in every slot a step
    writes), "batches": per step (positions, slot_mapping int64 [T_s]; cu_seqlens_q int32 [B + 2]; seq_lens
    int32 [B + 1]; block_table int32 [B + 1, max_blocks]: the last sequence is padding), "reals": real rows per
    step, "starts": per step the first row of each sequence, "inputs": per step (hidden, residual) bf16 [T_s,
    2880] (padding rows filled by the caller)}."""
    B = len(prefixes)
    steps = len(q_lens[0]) if q_lens else 0
    if B < 1 or len(q_lens) != B or steps < 1 or any(len(q) != steps or min(q) < 1 for q in q_lens) \
            or min(prefixes) < 0:
        raise ValueError(f"prefixes {prefixes} / q_lens {q_lens}: one list of positive lengths per sequence")
    final = [p + sum(q) for p, q in zip(prefixes, q_lens)] + [1]  # the padding sequence's: dropped below
    dims = {"query_heads": QUERY_HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM, "sliding_window": 0}
    built = attention.build_paged_attention_inputs(B + 1, dims, seed, seq_lens=final)
    kc, vc, table = built["key_cache"], built["value_cache"], built["block_table"]
    batches, reals, starts, inputs = [], [], [], []
    done = list(prefixes)
    for s in range(steps):
        lens = [q[s] for q in q_lens]
        real = sum(lens)
        tokens = capture_size(real)
        pos = torch.zeros(tokens, dtype=torch.int64)
        slot = torch.full((tokens,), -1, dtype=torch.int64)
        cu = torch.zeros(B + 2, dtype=torch.int32)
        cu[1:B + 1] = torch.tensor(lens, dtype=torch.int32).cumsum(0)
        cu[B + 1] = real
        seq = torch.zeros(B + 1, dtype=torch.int32)
        for b in range(B):
            p = torch.arange(done[b], done[b] + lens[b])
            rows = slice(int(cu[b]), int(cu[b + 1]))
            pos[rows] = p
            slot[rows] = table[b, p // attention.BLOCK_SIZE].long() * attention.BLOCK_SIZE + p % attention.BLOCK_SIZE
            done[b] += lens[b]
            seq[b] = done[b]
        batches.append({"positions": pos, "slot_mapping": slot, "cu_seqlens_q": cu, "seq_lens": seq,
                        "block_table": table})
        reals.append(real)
        starts.append(cu[:B].tolist())
        x = norm.build_inputs(tokens, {"hidden": HIDDEN, "eps": EPS}, seed + 1 + s, with_residual=True)
        inputs.append((x["x"], x["residual"]))
    for batch, real in zip(batches, reals):  # every slot a step writes starts as NaN
        for cache in (kc, vc):
            cache.view(-1, KV_HEADS, HEAD_DIM)[batch["slot_mapping"][:real]] = float("nan")
    return {"key_cache": kc, "value_cache": vc, "batches": batches, "reals": reals, "starts": starts,
            "inputs": inputs}


def real_batch(batch: dict, real: int, sequences: int | None = None) -> dict:
    """The step metadata of the real rows and sequences only (what the references run on): `real` rows, the
    first `sequences` sequences (default `real`: a decode batch, one row each)."""
    b = real if sequences is None else sequences
    return {"positions": batch["positions"][:real], "slot_mapping": batch["slot_mapping"][:real],
            "cu_seqlens_q": batch["cu_seqlens_q"][:b + 1], "seq_lens": batch["seq_lens"][:b],
            "block_table": batch["block_table"][:b]}


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


# ---- tensor parallelism (vLLM's cuts; the TP8 chain in regimes/gpt_oss_120b.toml runs on these) ----------

def shard_layer_weights(weights: dict, tp_rank: int, tp_size: int = 8) -> dict:
    """Rank tp_rank's slice of one layer's weights, as vLLM's gpt-oss loader cuts them (new tensors, not views):
    - qkv (QKVParallelLinear): the rows of the rank's Hq/tp query heads, then of its Hkv/tp KV heads' k and v
      (rows q [4096/tp r, ..), k [4096 + 512/tp r, ..), v [4608 + 512/tp r, ..)), with their scale rows and
      bias entries;
    - o (RowParallelLinear): the input columns of its query heads and their scale columns; the bias on rank 0
      only (vLLM adds it there: the other ranks get zeros, which add nothing);
    - sinks: its query heads';
    - MoE: references.moe.shard_columns's 32-column blocks of the intermediate dim (w13 rows 2 start .. 2 end,
      w2 columns and scale blocks; the w2 bias whole, added by rank 0: routed_rank_reference), as ordinary
      tensors (lazy experts drawn);
    - norms, router, cos_sin_cache: whole on every rank."""
    if tp_size < 1 or QUERY_HEADS % tp_size or KV_HEADS % tp_size or not 0 <= tp_rank < tp_size:
        raise ValueError(f"tp_rank {tp_rank} / tp_size {tp_size}: the heads ({QUERY_HEADS}, {KV_HEADS}) do not shard")
    w = weights
    hq, hkv = QUERY_HEADS // tp_size, KV_HEADS // tp_size
    q0, k0 = QUERY_HEADS * HEAD_DIM, (QUERY_HEADS + KV_HEADS) * HEAD_DIM
    rows = torch.cat([torch.arange(hq * HEAD_DIM) + tp_rank * hq * HEAD_DIM,
                      q0 + torch.arange(hkv * HEAD_DIM) + tp_rank * hkv * HEAD_DIM,
                      k0 + torch.arange(hkv * HEAD_DIM) + tp_rank * hkv * HEAD_DIM])
    cols = slice(tp_rank * hq * HEAD_DIM, (tp_rank + 1) * hq * HEAD_DIM)
    scols = slice(cols.start // 32, cols.stop // 32)
    out = {k: w[k] for k in ("attn_norm", "mlp_norm", "router_weight", "router_bias", "cos_sin_cache")}
    out.update(qkv=w["qkv"][rows].clone(), qkv_scales=w["qkv_scales"][rows].clone(),
               qkv_bias=w["qkv_bias"][rows].clone(),
               o=w["o"][:, cols].contiguous(), o_scales=w["o_scales"][:, scols].contiguous(),
               o_bias=w["o_bias"].clone() if tp_rank == 0 else torch.zeros_like(w["o_bias"]),
               sinks=w["sinks"][tp_rank * hq:(tp_rank + 1) * hq].clone())
    start, end = moe.shard_columns(INTERMEDIATE, tp_size, tp_rank)
    mrows = torch.arange(2 * start, 2 * end)
    # moe.plain: the lazy experts drawn as ordinary tensors (a shard is saved for the rank processes)
    out.update(w13_blocks=moe.plain(w["w13_blocks"][:, mrows]), w13_scales=moe.plain(w["w13_scales"][:, mrows]),
               w13_bias=moe.plain(w["w13_bias"][:, mrows]),
               w2_blocks=moe.plain(w["w2_blocks"][:, :, start // 2:end // 2]),
               w2_scales=moe.plain(w["w2_scales"][:, :, start // 32:end // 32]), w2_bias=w["w2_bias"])
    return out


def drawn_experts(weights: dict) -> dict:
    """`weights` with the lazy experts drawn as ordinary tensors (1.7 GB): for cutting every rank's shard from
    one draw (a lazy checkpoint's shard draws the whole w2 for its columns, ~1.3 s of CPU per rank)."""
    return {k: moe.plain(v) for k, v in weights.items()}


def release_weights() -> None:
    """Forget the cached layer weights and the experts' draw states (references.moe caches its last set), and
    collect: what a caller that dropped its own reference to build_layer_weights' result then no longer holds
    is freed (before 8 rank processes start, say)."""
    build_layer_weights.cache_clear()
    moe._lazy_weights.cache_clear()
    gc.collect()


def shard_cache(cache: torch.Tensor, tp_rank: int, tp_size: int = 8) -> torch.Tensor:
    """Rank tp_rank's KV cache: its KV heads of [num_blocks, 64, Hkv, 64] (a new tensor)."""
    hkv = cache.shape[2] // tp_size
    return cache[:, :, tp_rank * hkv:(tp_rank + 1) * hkv].contiguous()


def moe_rank_reference(rank: int):
    """The MoE reference on rank `rank`'s slice (shard_layer_weights): the slice is a checkpoint of its own
    columns (tp_size 1), the w2 bias added on rank 0 only -> the same partial as moe_mxfp4_gptoss(..., the
    whole checkpoint, tp_size, rank)."""
    def reference(x, topk_weights, topk_ids, w13_blocks, w13_scales, w13_bias, w2_blocks, w2_scales, w2_bias,
                  tp_size=1, tp_rank=0):
        if tp_rank != rank:
            raise ValueError(f"tp_rank: {tp_rank}, this reference is rank {rank}'s")
        return moe.moe_mxfp4_gptoss(x, topk_weights, topk_ids, w13_blocks, w13_scales, w13_bias, w2_blocks,
                                    w2_scales, w2_bias if rank == 0 else None)

    return reference


def routed_rank_reference(rank: int):
    """The routed MoE reference (the chain's `moe` step) on rank `rank`'s slice: the router on the whole router
    weight (replicated), then moe_rank_reference(rank) -> moe.moe_routed_mxfp4_gptoss(..., the whole
    checkpoint, tp_size, rank)'s partial."""
    def reference(x, router_weight, router_bias, w13_blocks, w13_scales, w13_bias, w2_blocks, w2_scales, w2_bias,
                  top_k=TOP_K, tp_size=1, tp_rank=0):
        topk_weights, topk_ids = moe.moe_route_softmax_topk(x, router_weight, router_bias, top_k)
        return moe_rank_reference(rank)(x, topk_weights, topk_ids, w13_blocks, w13_scales, w13_bias, w2_blocks,
                                        w2_scales, w2_bias, tp_size, tp_rank)

    return reference
