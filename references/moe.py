"""Mixture of experts with MXFP4 expert weights: routing, and the sorting-independent MoE forward.

Routing (`moe_route_softmax_topk`, gpt-oss):
- logits = bf16(x @ router_weight^T + router_bias): bf16 products accumulated in fp32, the bias added in
  fp32, rounded to bf16 once (round to nearest even), as the model's bf16 linear does.
- top-k of the bf16 logits, larger first; equal logits are broken deterministically, lower expert id first.
  A NaN logit (either sign) ranks last, below -inf (NaNs among themselves: lower id first); if one is
  selected, every weight of that token is NaN. An Inf in x makes its logits +-Inf or NaN, ranked the same way.
- topk_weights = fp32 softmax over the k selected logits (the other experts do not enter the softmax).
- Outputs topk_weights fp32 [tokens, k], topk_ids int32 [tokens, k] (descending logit order).
- Tolerance: the kernel's fp32 accumulation order differs from torch's, so a logit may round to the
  neighbouring bf16 value and swap two near-tied experts. The harness compares the dense routing matrix
  (weight at [token, id], zero elsewhere): cosine >= 0.999, and the kernel bitwise deterministic.

MoE forward (`moe_mxfp4_gptoss`, `moe_mxfp4_swiglu`), for each token m and slot j, e = topk_ids[m, j]:
1. Activation quantization: x bf16 [tokens, h] -> MXFP8 with references.mx.mxfp8_quantize (E4M3, one E8M0
   scale per 32 along h, scale = 2^(floor(log2(amax)) - 8), RNE, saturating).
2. Gate-up: g = xq @ W13[e]^T, W13 dequantized MXFP4 (E2M1 codes, low nibble = even k, one E8M0 scale per
   32 along h), exact products summed in fp32 (accumulate dtype fp32); + w13 bias (bf16 -> fp32) for gpt-oss.
3. Activation in fp32:
   gpt-oss: gate/up rows interleaved in the checkpoint (row 2i = gate i, row 2i+1 = up i);
            gate = min(gate, 7), up = clamp(up, -7, 7), a = (up + 1) * gate * sigmoid(1.702 * gate).
   SwiGLU:  rows [0, I) = gate, [I, 2I) = up (vLLM's w13 = [w1; w3]); a = silu(gate) * up, no bias.
4. Intermediate re-quantization: a -> MXFP8 (same rule), blocks of 32 along the intermediate dim aligned
   to the checkpoint's w2 scale blocks (global intermediate index 32b .. 32b+31).
5. Down: y = aq @ W2[e]^T (MXFP4, E8M0 per 32 along the intermediate dim), fp32 accumulate, + w2 bias,
   times topk_weights[m, j] (fp32), rounded to bf16: y_j = bf16(w_j (aq W2^T + b2)). (As vLLM's fused MoE
   keeps the weighted per-slot rows in the activation dtype before its sum; half the bytes of fp32 rows.)
6. Combine: out[m] = sum over j = 0, 1, ..., k-1 in that order of y_j, in fp32, rounded to bf16 once.
   Never an atomic add: the sum order is fixed. A pair whose expert id is outside [0, E) (graph-padding
   garbage) selects no expert and adds nothing.

Tensor parallelism (vLLM's gpt-oss MXFP4 loader): the intermediate dim is cut in whole 32-column scale
blocks. With nb = I/32 blocks, every rank takes ceil(nb/tp) blocks, per = 32 ceil(nb/tp) columns: rank r owns
[start, end) = [per r, min(per (r+1), I)) (gpt-oss TP8: 90 blocks, per = 384, ranks 0-6 hold 384 columns
and rank 7 holds [2688, 2880), 192). No scale block straddles two ranks, so a rank's result is steps 1-5
restricted to its columns, unchanged: its w13 rows (2 start .. 2 end interleaved, or gate/up [start, end)),
its w2 K-columns and their scale blocks, step 4's blocks exactly the checkpoint's; the w2 bias is added by
rank 0 only (vLLM zeroes it on the others), and the rank's partial output is rounded to bf16 (vLLM then
all-reduces). The partials summed in rank order equal the TP1 result up to summation order and the
partials' bf16 rounding (cosine >= 0.9999, not bitwise). No scale is requantized by sharding.

Checkpoint layout (the inputs): w13_blocks uint8 [E, 2I, h/2], w13_scales uint8 [E, 2I, h/32],
w2_blocks uint8 [E, h, I/2], w2_scales uint8 [E, h, I/32] (the same bytes as gpt-oss's [.., K/32, 16]
blocks), biases bf16 [E, 2I] and [E, h]. Scales are E8M0 bytes (2^(byte - 127)).

Special values: an E8M0 weight scale byte 255 is NaN (OCP MX): its 32 weights are NaN, so a w13 byte 255
makes that expert's gate/up value NaN for every token routed to it; the clamps propagate NaN (torch.clamp),
step 4 quantizes a NaN to an E4M3 NaN, and step 5 spreads it over the pair's whole row: every output of a
token with such a pair is NaN (its other tokens are untouched).

Batch invariance: a row's bits depend only on its own inputs (x, its routing, the weights), never on the
token count or the rest of the batch: the kernels sum gate-up K in one fixed grouping in every tier.

Token count: at most the package's limit (mxfp4_moe geometry's max_tokens: 65536 at hidden 2880, 32768 at
hidden 6144), where its buffers stay below 2 GiB; a larger count is refused naming x.

Tolerance: cosine >= 0.9999 against this reference (the kernel's fp32 sums run in another order; an
intermediate value on an E4M3 rounding boundary may move one step), the kernel bitwise deterministic, and
graph-padding rows (garbage hidden states, out-of-range topk_ids) neither read out of bounds nor change
real rows.
"""

from __future__ import annotations

import functools

import torch

from references.mx import MX_BLOCK, mxfp8_dequantize, mxfp8_quantize
from references.op import SPECIAL_ROWS, Op, special_rows

ROUTE_COSINE_MIN = 0.999
MOE_COSINE_MIN = 0.9999
GPTOSS_LIMIT = 7.0
GPTOSS_ALPHA = 1.702

# E2M1 code -> value (bit 3 sign, bits 2..1 exponent, bit 0 mantissa).
FP4_VALUES = torch.tensor(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
)


# byte -> (value of its low nibble, value of its high nibble): one lookup per byte, no per-nibble temporaries
_BYTE_VALUES = torch.stack((FP4_VALUES[torch.arange(256) & 0xF], FP4_VALUES[torch.arange(256) >> 4]), dim=1)


def mxfp4_dequantize(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """uint8 [..., K/2] (low nibble = even k) and E8M0 uint8 [..., K/32] -> fp32 [..., K] (exact)."""
    vals = _BYTE_VALUES[blocks.int()].reshape(*blocks.shape[:-1], blocks.shape[-1] * 2)
    scale = torch.ldexp(torch.ones(scales.shape), scales.float() - 127)
    scale = torch.where(scales == 255, torch.nan, scale)  # E8M0 255 is NaN (OCP MX), not 2^128
    k = vals.shape[-1]
    return (vals.reshape(*vals.shape[:-1], k // MX_BLOCK, MX_BLOCK) * scale.unsqueeze(-1)).reshape(vals.shape)


def gptoss_activation(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    gate = gate.clamp(max=GPTOSS_LIMIT)
    up = up.clamp(-GPTOSS_LIMIT, GPTOSS_LIMIT)
    return (up + 1.0) * gate * torch.sigmoid(GPTOSS_ALPHA * gate)


def swiglu_activation(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.silu(gate) * up


def shard_columns(intermediate: int, tp_size: int, tp_rank: int) -> tuple[int, int]:
    """(start, end): rank tp_rank's intermediate columns, whole 32-column blocks (vLLM's gpt-oss rule)."""
    if intermediate % MX_BLOCK or tp_size < 1 or not 0 <= tp_rank < tp_size:
        raise ValueError(f"tp_size {tp_size} / tp_rank {tp_rank} do not shard intermediate {intermediate}")
    per = -(-(intermediate // MX_BLOCK) // tp_size) * MX_BLOCK
    start, end = tp_rank * per, min((tp_rank + 1) * per, intermediate)
    if start >= end:
        raise ValueError(f"tp_rank {tp_rank}: no columns of intermediate {intermediate} at tp_size {tp_size}")
    return start, end


def _moe(x, topk_weights, topk_ids, w13_blocks, w13_scales, w13_bias, w2_blocks, w2_scales, w2_bias,
         activation: str, tp_size: int, tp_rank: int) -> tuple[torch.Tensor]:
    tokens, hidden = x.shape
    experts, two_i, _ = w13_blocks.shape
    inter = two_i // 2
    start, end = shard_columns(inter, tp_size, tp_rank)
    xq = mxfp8_dequantize(*mxfp8_quantize(x.float()))
    if activation == "gptoss":  # interleaved rows: gate 2i, up 2i+1
        gate_rows = torch.arange(start, end) * 2
        up_rows = gate_rows + 1
    else:
        gate_rows = torch.arange(start, end)
        up_rows = gate_rows + inter
    y = torch.zeros(tokens, topk_ids.shape[1], hidden)
    ids = topk_ids.long()
    for e in torch.unique(ids).tolist():
        if not 0 <= e < experts:  # a garbage id (graph-padding rows) selects no expert: its pair adds nothing
            continue
        m_idx, j_idx = torch.nonzero(ids == e, as_tuple=True)
        w13 = mxfp4_dequantize(w13_blocks[e], w13_scales[e])
        gate = xq[m_idx] @ w13[gate_rows].T
        up = xq[m_idx] @ w13[up_rows].T
        if w13_bias is not None:
            gate = gate + w13_bias[e, gate_rows].float()
            up = up + w13_bias[e, up_rows].float()
        act = gptoss_activation(gate, up) if activation == "gptoss" else swiglu_activation(gate, up)
        aq = mxfp8_dequantize(*mxfp8_quantize(act))
        w2 = mxfp4_dequantize(w2_blocks[e], w2_scales[e])[:, start:end]
        ye = aq @ w2.T
        if w2_bias is not None and tp_rank == 0:
            ye = ye + w2_bias[e].float()
        y[m_idx, j_idx] = (topk_weights[m_idx, j_idx].float().unsqueeze(1) * ye).to(torch.bfloat16).float()
    out = torch.zeros(tokens, hidden)
    for j in range(topk_ids.shape[1]):  # fixed order
        out = out + y[:, j]
    return (out.to(torch.bfloat16),)


def moe_mxfp4_gptoss(x, topk_weights, topk_ids, w13_blocks, w13_scales, w13_bias, w2_blocks, w2_scales, w2_bias,
                     tp_size: int = 1, tp_rank: int = 0) -> tuple[torch.Tensor]:
    """gpt-oss MoE block (interleaved gate/up, clamped activation, biases) -> (out bf16 [tokens, h],).

    At tp_size > 1 the result is rank tp_rank's partial sum (see the module docstring)."""
    return _moe(x, topk_weights, topk_ids, w13_blocks, w13_scales, w13_bias, w2_blocks, w2_scales, w2_bias,
                "gptoss", tp_size, tp_rank)


def moe_mxfp4_swiglu(x, topk_weights, topk_ids, w13_blocks, w13_scales, w2_blocks, w2_scales) -> tuple[torch.Tensor]:
    """Plain SwiGLU MoE block (w13 = [gate; up], no biases) -> (out bf16 [tokens, h],)."""
    return _moe(x, topk_weights, topk_ids, w13_blocks, w13_scales, None, w2_blocks, w2_scales, None,
                "swiglu", 1, 0)


def router_logits(x, router_weight, router_bias) -> torch.Tensor:
    """The bf16 router logits moe_route_softmax_topk ranks, as fp32 [tokens, E]."""
    return (x.float() @ router_weight.float().T + router_bias.float()).to(torch.bfloat16).float()


def moe_route_softmax_topk(x, router_weight, router_bias, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x bf16 [tokens, h], router_weight bf16 [E, h], router_bias bf16 [E]
    -> (topk_weights fp32 [tokens, k], topk_ids int32 [tokens, k])."""
    logits = router_logits(x, router_weight, router_bias)
    experts = logits.shape[1]
    # Stable order: larger logit first, then lower expert id (a stable sort of -logit keeps id order).
    order = torch.sort(-logits, dim=1, stable=True).indices[:, :top_k]
    vals = torch.gather(logits, 1, order)
    weights = torch.softmax(vals, dim=1)
    del experts
    return weights, order.to(torch.int32)


# ---- input builders -------------------------------------------------------------------------------------

def _dims(dims: dict) -> tuple[int, int, int, int]:
    """(hidden, intermediate (unsharded), experts, top_k); missing entries default to gpt-oss-120b."""
    return (int(dims["hidden"]), int(dims.get("intermediate", 2880)), int(dims.get("experts", 128)),
            int(dims.get("top_k", 4)))


def _scale_byte(k: int, in_rms: float, out_rms: float) -> int:
    """E8M0 byte that makes a K-long dot product of inputs with rms `in_rms` land near `out_rms`.

    Uniform E2M1 codes have rms ~2.93."""
    import math

    return 127 + round(math.log2(out_rms / (2.93 * math.sqrt(k) * in_rms)))


@functools.lru_cache(maxsize=1)
def _weights(hidden: int, inter: int, experts: int, biases: bool, seed: int) -> dict:
    """Expert weights in checkpoint layout, seeded by the shape only: every token count of one shape
    sees the same model (and the builder is fast after the first call)."""
    gen = torch.Generator().manual_seed(seed)
    two_i = 2 * inter

    def blocks(n, k):
        return torch.randint(0, 256, (experts, n, k // 2), dtype=torch.uint8, generator=gen)

    def scales(n, k, byte):  # byte - 1 .. byte + 1, drawn as uint8 (an int64 draw is 8x the bytes)
        return torch.randint(byte - 1, byte + 2, (experts, n, k // MX_BLOCK), dtype=torch.uint8, generator=gen)

    w = {
        "w13_blocks": blocks(two_i, hidden),
        "w13_scales": scales(two_i, hidden, _scale_byte(hidden, 1.0, 2.5)),
    }
    if biases:
        w["w13_bias"] = (0.3 * torch.randn(experts, two_i, generator=gen)).to(torch.bfloat16)
    w["w2_blocks"] = blocks(hidden, inter)
    w["w2_scales"] = scales(hidden, inter, _scale_byte(inter, 3.0, 1.0))
    if biases:
        w["w2_bias"] = (0.1 * torch.randn(experts, hidden, generator=gen)).to(torch.bfloat16)
    return w


def build_routing(tokens: int, experts: int, top_k: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Distinct expert ids per token with a skewed popularity (some experts hot, some cold) and
    softmax weights in descending order, like a trained router's output."""
    popularity = 1.5 * torch.randn(experts, generator=gen)
    logits = torch.randn(tokens, experts, generator=gen) + popularity
    vals, ids = logits.topk(top_k, dim=1)
    return torch.softmax(vals, dim=1), ids.to(torch.int32)


def build_moe_inputs(tokens: int, dims: dict, seed: int, *, activation: str) -> dict:
    hidden, inter, experts, top_k = _dims(dims)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=gen).to(torch.bfloat16)
    weights, ids = build_routing(tokens, experts, top_k, gen)
    inputs = {"x": x, "topk_weights": weights, "topk_ids": ids}
    inputs.update(_weights(hidden, inter, experts, activation == "gptoss", 1000 + hidden + inter + experts))
    if activation == "gptoss":
        inputs["tp_size"] = int(dims.get("tp_size", 1))
        inputs["tp_rank"] = int(dims.get("tp_rank", 0))
    return inputs


def build_route_inputs(tokens: int, dims: dict, seed: int) -> dict:
    hidden, _, experts, top_k = _dims(dims)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=gen).to(torch.bfloat16)
    wgen = torch.Generator().manual_seed(2000 + hidden + experts)
    w = (torch.randn(experts, hidden, generator=wgen) / hidden**0.5).to(torch.bfloat16)
    b = (0.5 * torch.randn(experts, generator=wgen)).to(torch.bfloat16)
    return {"x": x, "router_weight": w, "router_bias": b, "top_k": top_k}


def build_route_cancelling_inputs(tokens: int, dims: dict, seed: int) -> dict:
    """Router inputs whose logits expose the fp32 summation order: the weight's two hidden halves are equal
    and x's second half is minus its first (|x| ~ 2^8), leaving one small uncancelled block (the last 32
    channels). Used only to check batch invariance."""
    inputs = build_route_inputs(tokens, dims, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    half = inputs["x"].shape[1] // 2
    big = (torch.randn(tokens, half, generator=gen) * 2.0**8).to(torch.bfloat16)
    x = torch.cat([big, -big], dim=1)
    x[:, half - MX_BLOCK: half] = 0  # (the partner of the uncancelled block)
    x[:, -MX_BLOCK:] = torch.randn(tokens, MX_BLOCK, generator=gen).to(torch.bfloat16)
    w = inputs["router_weight"]
    inputs.update(x=x, router_weight=torch.cat([w[:, :half], w[:, :half]], dim=1).contiguous())
    return inputs


def build_route_special_inputs(tokens: int, dims: dict, seed: int) -> dict:
    """build_route_inputs with NaN, +-Inf and subnormals planted in x (references.op.special_rows) and a NaN
    in expert 9's weight row (its logit is NaN for every token: it must rank last)."""
    inputs = build_route_inputs(max(tokens, SPECIAL_ROWS), dims, seed)
    inputs["x"] = special_rows(inputs["x"], seed)
    w = inputs["router_weight"].clone()
    w[9, 100] = float("nan")
    inputs["router_weight"] = w
    return inputs


def routing_matrix(outputs) -> tuple[torch.Tensor]:
    """(topk_weights, topk_ids) -> dense fp32 [tokens, E=128 or more] with each weight at its expert."""
    weights, ids = outputs
    experts = max(128, int(ids.max()) + 1) if ids.numel() else 128
    dense = torch.zeros(weights.shape[0], experts)
    dense.scatter_(1, ids.long().clamp(0, experts - 1), weights.float())
    return (dense,)


def _as_float(outputs) -> tuple[torch.Tensor, ...]:
    return tuple(t.float() for t in outputs)


OPS = (
    Op("moe_route_softmax_topk", moe_route_softmax_topk, build_route_inputs, routing_matrix, ("routing",),
       ROUTE_COSINE_MIN, ("x",), build_cancelling=build_route_cancelling_inputs,
       build_special=build_route_special_inputs),
    Op("moe_mxfp4_gptoss", moe_mxfp4_gptoss,
       lambda t, d, s: build_moe_inputs(t, d, s, activation="gptoss"),
       _as_float, ("out",), MOE_COSINE_MIN, ("x", "topk_weights", "topk_ids")),
    Op("moe_mxfp4_swiglu", moe_mxfp4_swiglu,
       lambda t, d, s: build_moe_inputs(t, d, s, activation="swiglu"),
       _as_float, ("out",), MOE_COSINE_MIN, ("x", "topk_weights", "topk_ids")),
)
