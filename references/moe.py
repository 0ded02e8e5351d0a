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

Routed MoE (`moe_routed_mxfp4_gptoss`): the router above, then the gpt-oss MoE forward, from the hidden
states and the router's weights (what vLLM's FusedMoE layer gets); a composition, see its docstring.

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
import hashlib
import math

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


def moe_routed_mxfp4_gptoss(x, router_weight, router_bias, w13_blocks, w13_scales, w13_bias, w2_blocks, w2_scales,
                            w2_bias, top_k: int = 4, tp_size: int = 1, tp_rank: int = 0) -> tuple[torch.Tensor]:
    """gpt-oss MoE block with its router, from the hidden states: (out bf16 [tokens, h],).

    The composition of the two references above, nothing else: (topk_weights, topk_ids) =
    moe_route_softmax_topk(x, router_weight, router_bias, top_k), then moe_mxfp4_gptoss(x, topk_weights,
    topk_ids, ...). Inputs: x bf16 [tokens, h]; router_weight bf16 [E, h] and router_bias bf16 [E] (vLLM's
    gpt-oss router linear); the expert weights in checkpoint layout as for moe_mxfp4_gptoss. Rounding points,
    layouts and the TP contract are theirs (the routing in fp32 then bf16 logits, fp32 softmax; the MoE's
    steps 1-6 above).

    Tolerance: cosine >= 0.9999 (the MoE's), the kernel bitwise deterministic and batch invariant, padding
    rows harmless. A routed kernel's logit may round to the neighbouring bf16 value (the router's tolerance)
    and swap two near-tied experts of a token; that token's row then differs. The seeded inputs of the
    checked counts hold no such tie: a swap is a failure to look at, not noise to tolerate."""
    topk_weights, topk_ids = moe_route_softmax_topk(x, router_weight, router_bias, top_k)
    return moe_mxfp4_gptoss(x, topk_weights, topk_ids, w13_blocks, w13_scales, w13_bias, w2_blocks, w2_scales,
                            w2_bias, tp_size, tp_rank)


# ---- input builders -------------------------------------------------------------------------------------

def _dims(dims: dict) -> tuple[int, int, int, int]:
    """(hidden, intermediate (unsharded), experts, top_k); missing entries default to gpt-oss-120b."""
    return (int(dims["hidden"]), int(dims.get("intermediate", 2880)), int(dims.get("experts", 128)),
            int(dims.get("top_k", 4)))


def _scale_byte(k: int, in_rms: float, out_rms: float) -> int:
    """E8M0 byte that makes a K-long dot product of inputs with rms `in_rms` land near `out_rms`.

    Uniform E2M1 codes have rms ~2.93."""
    return 127 + round(math.log2(out_rms / (2.93 * math.sqrt(k) * in_rms)))


def _weight_plan(hidden: int, inter: int, experts: int, biases: bool) -> list[tuple]:
    """The checkpoint's random tensors: (name, "codes", [E, n, k] uint8, low, high), uniform integers in
    [low, high) drawn per row block (_draw_block), or (name, "normal", [E, n] bf16, std) drawn whole with randn.
    One list for the eager and the lazy build."""
    two_i = 2 * inter

    def codes(name, n, k):
        return (name, "codes", (experts, n, k // 2), 0, 256)

    def scales(name, n, k, byte):  # byte - 1 .. byte + 1
        return (name, "codes", (experts, n, k // MX_BLOCK), byte - 1, byte + 2)

    plan = [codes("w13_blocks", two_i, hidden), scales("w13_scales", two_i, hidden, _scale_byte(hidden, 1.0, 2.5))]
    if biases:
        plan.append(("w13_bias", "normal", (experts, two_i), 0.3))
    plan += [codes("w2_blocks", hidden, inter), scales("w2_scales", hidden, inter, _scale_byte(inter, 3.0, 1.0))]
    if biases:
        plan.append(("w2_bias", "normal", (experts, hidden), 0.1))
    return plan


# Rows of one expert drawn from one generator seed. TP8 shards start at multiples of 768 w13 rows, so a rank's
# rows are drawn without the other ranks'.
ROW_BLOCK = 256


def _draw_seed(seed: int, name: str, expert: int = 0, block: int = 0) -> int:
    """The generator seed of one row block of one expert of a checkpoint tensor (or of a whole "normal" one):
    a hash of where it sits, so any block is drawn alone, with nothing drawn before it."""
    key = f"{seed}:{name}:{expert}:{block}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")


def _draw_block(plan_entry: tuple, seed: int, expert: int, block: int, gen: torch.Generator,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """Rows [ROW_BLOCK block, ...) of one expert of a "codes" tensor, [rows, *shape[2:]] uint8 (into `out`,
    a contiguous tensor of that shape, when given)."""
    name, _, shape, low, high = plan_entry
    rows = min(ROW_BLOCK, shape[1] - block * ROW_BLOCK)
    out = torch.empty((rows, *shape[2:]), dtype=torch.uint8) if out is None else out
    gen.manual_seed(_draw_seed(seed, name, expert, block))
    if (low, high) != (0, 256):
        return torch.randint(low, high, out.shape, dtype=torch.uint8, generator=gen, out=out)
    # every byte uniform: 64-bit draws, 8 bytes each (randint draws 32 bits a byte); little-endian bytes (every
    # host we run). In place where `out` is whole 8-byte words.
    count = out.numel()
    if count % 8 == 0 and out.storage_offset() % 8 == 0:
        out.view(-1).view(torch.int64).random_(-2**63, None, generator=gen)
        return out
    words = torch.empty(-(-count // 8), dtype=torch.int64).random_(-2**63, None, generator=gen)
    out.copy_(words.view(torch.uint8)[:count].view(out.shape))
    return out


def _draw_normal(shape, std, seed: int, name: str) -> torch.Tensor:
    gen = torch.Generator().manual_seed(_draw_seed(seed, name))
    return (std * torch.randn(*shape, generator=gen)).to(torch.bfloat16)


@functools.lru_cache(maxsize=1)
def _weights(hidden: int, inter: int, experts: int, biases: bool, seed: int) -> dict:
    """Expert weights in checkpoint layout, seeded by the shape only: every token count of one shape
    sees the same model. Filled block by block (the definition the lazy build's slices are checked against);
    inside a FakeTensorMode the uint8 tensors are left unfilled (a fake tensor holds no bytes)."""
    gen = torch.Generator()
    w = {}
    for entry in _weight_plan(hidden, inter, experts, biases):
        name, kind, shape = entry[:3]
        if kind == "normal":
            w[name] = _draw_normal(shape, entry[3], seed, name)
            continue
        w[name] = torch.empty(shape, dtype=torch.uint8)
        if _faking():
            continue
        for e in range(shape[0]):
            for b in range(-(-shape[1] // ROW_BLOCK)):
                _draw_block(entry, seed, e, b, gen, out=w[name][e, b * ROW_BLOCK:(b + 1) * ROW_BLOCK])
    return w


class _WeightStream:
    """_weights' uint8 tensors drawn in parts: any experts' rows, block by block from their seeds (_draw_block),
    bit for bit the same as that part of the whole tensor; the small bf16 biases held whole."""

    def __init__(self, hidden, inter, experts, biases, seed):
        self.seed = seed
        self.plan = {p[0]: p for p in _weight_plan(hidden, inter, experts, biases)}
        self.whole = {name: _draw_normal(shape, args[0], seed, name)
                      for name, kind, shape, *args in self.plan.values() if kind == "normal"}

    def draw(self, name: str, lo: int, hi: int, r0: int = 0, r1: int | None = None) -> torch.Tensor:
        """Rows [r0, r1) of experts [lo, hi) of tensor `name`, bit for bit _weights(...)[name][lo:hi, r0:r1]."""
        entry = self.plan[name]
        shape = entry[2]
        r1 = shape[1] if r1 is None else r1
        out = torch.empty((max(0, hi - lo), max(0, r1 - r0), *shape[2:]), dtype=torch.uint8)
        gen = torch.Generator()
        for e in range(lo, hi):
            for b in range(r0 // ROW_BLOCK, -(-r1 // ROW_BLOCK)):
                first, last = max(r0, b * ROW_BLOCK), min(r1, (b + 1) * ROW_BLOCK)  # the block's wanted rows
                into = out[e - lo, first - r0:last - r0]
                if last - first == min(ROW_BLOCK, shape[1] - b * ROW_BLOCK):  # the whole block: drawn in place
                    _draw_block(entry, self.seed, e, b, gen, out=into)
                else:
                    into.copy_(_draw_block(entry, self.seed, e, b, gen)[first - b * ROW_BLOCK:last - b * ROW_BLOCK])
        return out


_aten = torch.ops.aten


def _is_range(i) -> bool:
    """A 1-D integer index tensor holding a, a + 1, ..., b - 1 (a TP shard's rows)."""
    return (isinstance(i, torch.Tensor) and not isinstance(i, LazyExperts) and i.dim() == 1 and i.numel() > 0
            and i.dtype in (torch.int64, torch.int32) and int(i[0]) >= 0 and bool((i.diff() == 1).all()))


class LazyExperts(torch.Tensor):
    """A uint8 checkpoint tensor [E, ...] kept as the recipe of its draws (_WeightStream): indexing one expert
    or slicing experts (t[e], t[a:b], also after slices of the other dims) regenerates only those; any other
    op materializes it whole first. So a MoE case never holds the ~1.6 GB checkpoint next to the prepared
    weights: preparing works through a few experts at a time, the reference through its routed experts."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, stream: _WeightStream, name: str, lo: int, hi: int, post: tuple = ()):
        shape = [hi - lo, *stream.plan[name][2][1:]]
        for dim, start, end in post:
            shape[dim] = end - start
        t = torch.Tensor._make_wrapper_subclass(cls, shape, dtype=torch.uint8, device=torch.device("cpu"))
        t._recipe = (stream, name, lo, hi, post)
        return t

    def materialize(self) -> torch.Tensor:
        stream, name, lo, hi, post = self._recipe
        rows = [(start, end) for dim, start, end in post if dim == 1]
        out = stream.draw(name, lo, hi, *(rows[0] if rows else ()))  # only the rows kept
        for dim, start, end in post:
            if dim != 1:
                out = out.narrow(dim, start, end - start)
        return out.contiguous()

    def __repr__(self):
        return f"LazyExperts({self._recipe[1]}[{self._recipe[2]}:{self._recipe[3]}], shape={list(self.shape)})"

    def _sliced(self, dim: int, start, end):
        stream, name, lo, hi, post = self._recipe
        start, end, _ = slice(start, end).indices(self.shape[dim])
        end = max(start, end)
        if dim == 0:
            return LazyExperts(stream, name, lo + start, lo + end, post)
        kept = [p for p in post if p[0] == dim]  # one range per dim: a slice of a slice is a narrower one
        base = kept[0][1] if kept else 0
        return LazyExperts(stream, name, lo, hi, (*(p for p in post if p[0] != dim), (dim, base + start, base + end)))

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        t = args[0] if args else None
        if isinstance(t, LazyExperts) and not kwargs:
            if func is _aten.select.int and args[1] == 0:
                e = args[2] % t.shape[0]
                return t._sliced(0, e, e + 1).materialize()[0]
            if func is _aten.slice.Tensor:
                dim, start, end, step = (list(args[1:]) + [0, None, None, 1][len(args) - 1:])[:4]
                if step == 1:
                    return t._sliced(dim % t.dim(), start, end)
            if func in (_aten.detach.default, _aten.alias.default):
                return LazyExperts(*t._recipe)
            index = args[1] if func is _aten.index.Tensor else None
            if index and len(index) == 2 and index[0] is None and _is_range(index[1]):  # t[:, a:b] as an index
                return t._sliced(1, int(index[1][0]), int(index[1][-1]) + 1)
            if index and index[0] is None and sum(i is not None for i in index) == 1 and not any(
                    isinstance(i, LazyExperts) for i in index):  # t[:, rows] (a TP shard): a few experts at a time
                step = max(1, t.shape[0] // 16)
                return torch.cat([func(t._sliced(0, e, e + step).materialize(), index)
                                  for e in range(0, t.shape[0], step)])

        def real(a):
            return a.materialize() if isinstance(a, LazyExperts) else a

        return func(*torch.utils._pytree.tree_map(real, args), **torch.utils._pytree.tree_map(real, kwargs))


def plain(t: torch.Tensor, experts_per_draw: int = 8) -> torch.Tensor:
    """`t` as an ordinary contiguous tensor: a LazyExperts drawn `experts_per_draw` experts at a time (a slice
    of its last dim, e.g. a TP shard's w2 columns, then holds one chunk's whole rows beside the result, not the
    whole tensor's), anything else made contiguous. For what needs real storage (torch.save, another process)."""
    if not isinstance(t, LazyExperts):
        return t.contiguous()
    out = torch.empty(t.shape, dtype=t.dtype)  # filled chunk by chunk: no second whole copy (torch.cat's)
    for e in range(0, t.shape[0], experts_per_draw):
        out[e:e + experts_per_draw] = t._sliced(0, e, e + experts_per_draw).materialize()
    return out


@functools.lru_cache(maxsize=1)
def _lazy_weights(hidden: int, inter: int, experts: int, biases: bool, seed: int) -> dict:
    """_weights as LazyExperts (the biases whole): the same bytes, regenerated where used."""
    stream = _WeightStream(hidden, inter, experts, biases, seed)
    w = {}
    for name, kind, shape, *_ in stream.plan.values():
        w[name] = stream.whole[name] if kind == "normal" else LazyExperts(stream, name, 0, shape[0])
    return w


def _faking() -> bool:
    """Inside a FakeTensorMode (the harness builds hollow inputs so): build plain (fake) tensors."""
    return torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is not None


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
    build = _weights if _faking() else _lazy_weights  # lazy: regenerated expert by expert where used
    inputs.update(build(hidden, inter, experts, activation == "gptoss", 1000 + hidden + inter + experts))
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


def build_routed_moe_inputs(tokens: int, dims: dict, seed: int) -> dict:
    """moe_routed_mxfp4_gptoss's inputs: the router's (build_route_inputs: x, router weight and bias, top_k)
    and the gpt-oss expert weights and TP rank of build_moe_inputs: the same cached lazy checkpoint (the same
    tensor objects, so a package's `moe` and `routed` entries share one set of prepared weights)."""
    hidden, inter, experts, _ = _dims(dims)
    inputs = build_route_inputs(tokens, dims, seed)
    build = _weights if _faking() else _lazy_weights  # lazy: regenerated expert by expert where used
    inputs.update(build(hidden, inter, experts, True, 1000 + hidden + inter + experts))
    inputs["tp_size"] = int(dims.get("tp_size", 1))
    inputs["tp_rank"] = int(dims.get("tp_rank", 0))
    return inputs


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
    # a token's result is its own row's (activation quantized per row, its own k experts): a sampled case's
    # reference runs only the sampled tokens' experts
    Op("moe_mxfp4_gptoss", moe_mxfp4_gptoss,
       lambda t, d, s: build_moe_inputs(t, d, s, activation="gptoss"),
       _as_float, ("out",), MOE_COSINE_MIN, ("x", "topk_weights", "topk_ids"), rows_independent=True),
    Op("moe_routed_mxfp4_gptoss", moe_routed_mxfp4_gptoss, build_routed_moe_inputs, _as_float, ("out",),
       MOE_COSINE_MIN, ("x",), rows_independent=True),
    Op("moe_mxfp4_swiglu", moe_mxfp4_swiglu,
       lambda t, d, s: build_moe_inputs(t, d, s, activation="swiglu"),
       _as_float, ("out",), MOE_COSINE_MIN, ("x", "topk_weights", "topk_ids"), rows_independent=True),
)
