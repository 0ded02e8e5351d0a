"""gpt-oss attention: the contract both attention ops share, the YaRN cos/sin cache, and rope + KV write.

What vLLM's gpt-oss model passes (vllm/model_executor/models/gpt_oss.py `OAIAttention`, the rotary
embedding in vllm/model_executor/layers/rotary_embedding/{base,common,yarn_scaling_rope}.py, the KV-cache
write `reshape_and_cache_flash` the ROCm backends call), restated here so kernels and tests agree:

Heads and shapes
- 64 query heads and 8 KV heads at TP1 (config.num_attention_heads, num_key_value_heads), 8 and 1 at TP8
  (vLLM divides both by tp_size); head_dim 64 (config.head_dim); softmax scale 64**-0.5 (`self.scaling =
  head_dim**-0.5`). GQA: query head h reads KV head h // (Hq / Hkv).
- qkv bf16 [T, (Hq + 2 Hkv) * 64] is the QKV projection's output row as vLLM splits it:
  q = columns [0, Hq*64), k = [Hq*64, (Hq+Hkv)*64), v = the last Hkv*64; head j of each part is the 64
  consecutive columns j*64..j*64+63. TP1: 5120 columns; TP8: 640.

KV cache (vLLM's flash layout)
- key_cache and value_cache: each [num_blocks, block_size, Hkv, 64], contiguous, block_size 64 (what the
  MI355X recipe serves with). Token t's key for KV head j lives at key_cache[slot // 64, slot % 64, j, :].
  (vLLM's Triton backend allocates one [num_blocks, 2, block_size, Hkv, 64] tensor and hands out the two
  halves as strided views; these ops take two separate contiguous tensors, the flash backend's layout.)
- Tier 1: bf16 cache, written as the bf16 values (k after rotation, v as is).
- Tier 2: float8_e4m3fn cache with per-tensor fp32 scales k_scale, v_scale (tensors of one element, vLLM's
  layer._k_scale / _v_scale). Stored code = e4m3(x / scale): x the bf16 value as fp32, divided in fp32
  (IEEE division), then rounded to nearest even onto the E4M3 grid, saturating to +-448 (finite values
  never become NaN; NaN stays NaN) - vLLM's scaled_convert with saturation. Readers dequantize as
  code * scale in fp32.
- slot_mapping int64 [T]: slot = block * block_size + offset, one slot per token; -1 = write nothing
  (vLLM pads CUDA-graph batches with -1 slots). Real tokens of one call have distinct slots. The kernels do
  not range-check slots or positions against the cache sizes (that would cost a device sync); the caller
  (vLLM's block manager) guarantees 0 <= slot < num_blocks * block_size and 0 <= position < max_positions.

RoPE (NeoX style, over the whole head)
- cos_sin_cache fp32 [max_positions, 64]: row p = cos(p * f_i) * mscale for i < 32, then sin(p * f_i) *
  mscale, f_i the YaRN frequencies. vLLM builds it once (get_rope(..., dtype=float32)); `build_cos_sin_cache`
  below does the same computation in the same fp32 order, so its bits equal vLLM's CPU-built cache.
- Rotation of a head x (64 values), c = cos half, s = sin half of row positions[t]:
  out[i] = x[i] * c[i] - x[i+32] * s[i],  out[i+32] = x[i+32] * c[i] + x[i] * s[i],  i < 32.
  Applied to every q head and every k head of the token; v is not rotated.
- How the numbers come from gpt-oss's config.json:
  rope_theta 150000 -> theta; rope_scaling.factor 32 -> factor; rope_scaling.original_max_position_embeddings
  4096 -> the YaRN base length; beta_fast 32, beta_slow 1 -> the ramp's ends; rope_scaling.truncate false ->
  the ramp ends are not rounded to integers (vLLM passes config truncate, default true, to
  yarn_find_correction_range); max_position_embeddings 131072 = 4096 * 32 -> max_positions (rows);
  head_dim 64 -> the rotary dim (the whole head). No attention_factor / mscale keys -> mscale =
  0.1 * ln(factor) + 1 = 1.3465736 (yarn_get_mscale), multiplied into both cos and sin.
- YaRN frequencies: base_i = theta ** (2i / 64) (fp32), extrapolated f = 1 / base_i, interpolated
  f / factor; the ramp r_i = clamp((i - low) / (high - low), 0, 1) with low/high = 64 * ln(4096 / (beta * 2
  pi)) / (2 ln theta) for beta = beta_fast / beta_slow (here 8.093 and 17.40), and f_i = interp * r_i +
  extrap * (1 - r_i): the fast dims (i < low) keep the original frequency, the slow ones (i > high) are
  divided by the factor.

rope_kv_write(qkv, positions, cos_sin_cache, slot_mapping, key_cache, value_cache[, k_scale, v_scale])
    -> (q,) with q bf16 [T, Hq, 64] rotated; key_cache / value_cache mutated in place (declared in the
    custom op's schema as mutated arguments), nothing else written.
- Rounding points: x (bf16) -> fp32 exactly; each product and the sum in fp32; the rotated value rounded
  to bf16 once (round to nearest even). q is returned in that bf16; k is written in that bf16 (bf16 tier)
  or its e4m3 code (fp8 tier: the bf16-rounded k divided by k_scale, as vLLM quantizes the bf16 k its
  rotary embedding returned); v is copied bit for bit (bf16 tier) or e4m3(v / v_scale) (fp8 tier).
- vLLM's CUDA/HIP rotary path first casts cos_sin_cache to the query dtype (bf16) and computes in bf16
  arithmetic; this contract keeps cos/sin and the arithmetic in fp32 (closer to the exact rotation; the two
  differ by about one bf16 ulp).
- Tolerance: q and the written K slots reach cosine >= 0.99999 against this reference (a kernel may fuse a
  multiply-add, moving a value by at most one bf16 ulp, or one E4M3 step on the fp8 tier); the written V
  slots of the bf16 tier equal the input bits; every cache byte outside the written slots is unchanged
  (bitwise); a row with slot -1 writes nothing; the kernel is bitwise deterministic run to run, and each
  token's q and cache writes depend only on its own row (batch invariant; graph-padding rows harmless).

paged attention (op 2, the other half of this module) reads the same cache layout, heads, scale and
dequantization rule: paged_attention on the bf16 tier, paged_attention_fp8 (k_scale, v_scale appended) on
the fp8 tier.
"""

from __future__ import annotations

import functools
import math

import torch

from references.op import Op

HEAD_DIM = 64
BLOCK_SIZE = 64
SCALE = HEAD_DIM**-0.5
FP8_MAX = 448.0
COSINE_MIN = 0.99999

# gpt-oss-120b's config.json values the cos/sin cache depends on (see the module docstring).
GPT_OSS_ROPE = {
    "theta": 150000.0,
    "factor": 32.0,
    "original_max_position_embeddings": 4096,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "max_position_embeddings": 131072,
}
# Heads per TP size (query, KV) for gpt-oss-120b.
HEADS = {1: (64, 8), 8: (8, 1)}


def yarn_mscale(factor: float) -> float:
    """The YaRN attention factor multiplied into cos and sin: 0.1 ln(factor) + 1 (1 when factor <= 1)."""
    return 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0


def _correction_dim(rotations: float, dim: int, theta: float, original_max: int) -> float:
    """The rotary dim index whose wavelength fits `rotations` times into the original context."""
    return dim * math.log(original_max / (rotations * 2 * math.pi)) / (2 * math.log(theta))


def yarn_inv_freq(dim: int, theta: float, factor: float, original_max: int, beta_fast: float,
                  beta_slow: float, truncate: bool) -> torch.Tensor:
    """fp32 [dim / 2]: YaRN's blend of the original (fast dims) and factor-divided (slow dims) frequencies."""
    base_pow = theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    extrapolated = 1.0 / base_pow
    interpolated = 1.0 / (factor * base_pow)
    low = _correction_dim(beta_fast, dim, theta, original_max)
    high = _correction_dim(beta_slow, dim, theta, original_max)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1 where the original frequency is kept
    return interpolated * (1 - keep) + extrapolated * keep


@functools.lru_cache(maxsize=4)
def _cos_sin_cache(dim: int, max_positions: int, items: tuple) -> torch.Tensor:
    rope = dict(items)
    inv_freq = yarn_inv_freq(dim, rope["theta"], rope["factor"], rope["original_max_position_embeddings"],
                             rope["beta_fast"], rope["beta_slow"], rope["truncate"])
    rows = max(math.ceil(rope["original_max_position_embeddings"] * rope["factor"]), max_positions)
    t = torch.arange(rows, dtype=torch.float32)
    freqs = torch.einsum("i,j -> ij", t, inv_freq)
    mscale = yarn_mscale(rope["factor"])
    cache = torch.cat((freqs.cos() * mscale, freqs.sin() * mscale), dim=-1)
    cache.requires_grad_(False)
    return cache


def build_cos_sin_cache(dim: int = HEAD_DIM, max_positions: int | None = None, rope: dict | None = None
                        ) -> torch.Tensor:
    """fp32 [max_positions, dim]: cos | sin halves, mscale applied (vLLM's YaRN cos_sin_cache).

    Cached: the same tensor object is returned for the same arguments; callers must not modify it."""
    rope = {**GPT_OSS_ROPE, **(rope or {})}
    rows = int(max_positions or rope["max_position_embeddings"])
    return _cos_sin_cache(dim, rows, tuple(sorted(rope.items())))


def rotate_neox(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x bf16 [T, H, 64], cos / sin fp32 [T, 32] -> bf16 [T, H, 64]; fp32 arithmetic, one rounding."""
    half = x.shape[-1] // 2
    xf = x.float()
    x1, x2 = xf[..., :half], xf[..., half:]
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).to(torch.bfloat16)


def quantize_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """bf16 values -> float8_e4m3fn codes of x / scale (fp32 division, RNE, saturating to +-448)."""
    if x.dim() == 0 or x.numel() <= _QUANTIZE_CHUNK:
        return _quantize_fp8(x, scale)
    # elementwise, so chunks of rows give the same bytes: ~4x a chunk of fp32 temporaries, not ~4x x (a KV cache)
    out = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    step = max(1, _QUANTIZE_CHUNK // max(1, x[0].numel()))
    for i in range(0, x.shape[0], step):
        out[i:i + step] = _quantize_fp8(x[i:i + step], scale)
    return out


_QUANTIZE_CHUNK = 1 << 24  # elements


def _quantize_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    # in place on one fp32 temporary; clamp keeps NaN a NaN (E4M3 has no Inf: +-Inf saturate to +-448)
    y = x.float().div_(scale.float().reshape(()))
    return y.clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def split_qkv(qkv: torch.Tensor, kv_heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """qkv [T, (Hq + 2 Hkv) * 64] -> q [T, Hq, 64], k [T, Hkv, 64], v [T, Hkv, 64] (views)."""
    tokens = qkv.shape[0]
    heads = qkv.shape[1] // HEAD_DIM
    hq = heads - 2 * kv_heads
    x = qkv.reshape(tokens, heads, HEAD_DIM)
    return x[:, :hq], x[:, hq:hq + kv_heads], x[:, hq + kv_heads:]


def write_kv_cache(k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor, key_cache: torch.Tensor,
                   value_cache: torch.Tensor, k_scale=None, v_scale=None) -> None:
    """Write k, v bf16 [T, Hkv, 64] to their slots (slot -1: nothing); fp8 caches get e4m3(x / scale)."""
    live = slot_mapping >= 0
    slots = slot_mapping[live]
    block_size = key_cache.shape[1]
    blocks, offsets = slots // block_size, slots % block_size
    k, v = k[live], v[live]
    if key_cache.dtype == torch.float8_e4m3fn:
        k, v = quantize_fp8(k, k_scale), quantize_fp8(v, v_scale)
    key_cache[blocks, offsets] = k
    value_cache[blocks, offsets] = v


def rope_kv_write(qkv: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor,
                  slot_mapping: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                  k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor]:
    """qkv bf16 [T, (Hq + 2 Hkv) * 64], positions int64 [T], cos_sin_cache fp32 [P, 64], slot_mapping int64
    [T], key_cache / value_cache [num_blocks, 64, Hkv, 64] (bf16, or float8_e4m3fn with k_scale / v_scale
    fp32 [1]) -> (q bf16 [T, Hq, 64],); q and k rotated (NeoX), k and v written to the cache in place."""
    kv_heads = key_cache.shape[2]
    q, k, v = split_qkv(qkv, kv_heads)
    cos_sin = cos_sin_cache.index_select(0, positions)
    half = cos_sin.shape[1] // 2
    cos, sin = cos_sin[:, :half], cos_sin[:, half:]
    q_rot = rotate_neox(q, cos, sin)
    k_rot = rotate_neox(k, cos, sin)
    write_kv_cache(k_rot, v, slot_mapping, key_cache, value_cache, k_scale, v_scale)
    return (q_rot,)


def rope_kv_write_fp8(qkv, positions, cos_sin_cache, slot_mapping, key_cache, value_cache, k_scale, v_scale):
    """rope_kv_write with a float8_e4m3fn cache and per-tensor fp32 scales k_scale / v_scale [1]."""
    return rope_kv_write(qkv, positions, cos_sin_cache, slot_mapping, key_cache, value_cache, k_scale, v_scale)


def garbage_cache(num_blocks: int, kv_heads: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """[num_blocks, 64, kv_heads, 64] filled with what must never reach an output: NaN, +-65504 (or the
    fp8 maximum / NaN code) and 1e4-scale noise, so an unwritten or wrongly read slot shows."""
    shape = (num_blocks, BLOCK_SIZE, kv_heads, HEAD_DIM)
    noise = torch.randn(shape, generator=gen) * 1e4
    kind = torch.randint(0, 4, shape, generator=gen)
    big = FP8_MAX if dtype == torch.float8_e4m3fn else 65504.0
    pattern = torch.tensor([float("nan"), big, -big, 0.0])
    values = torch.where(kind == 3, noise, pattern[kind])
    if dtype == torch.float8_e4m3fn:
        values = torch.where(torch.isnan(values), values, values.clamp(-FP8_MAX, FP8_MAX))
    return values.to(dtype)


def _heads(dims: dict) -> tuple[int, int]:
    hq, hkv = int(dims.get("query_heads", 64)), int(dims.get("kv_heads", 8))
    if int(dims.get("head_dim", HEAD_DIM)) != HEAD_DIM or hq % hkv:
        raise ValueError(f"unsupported heads {hq}/{hkv} or head_dim {dims.get('head_dim')}")
    return hq, hkv


def build_rope_inputs(tokens: int, dims: dict, seed: int, *, fp8: bool = False) -> dict:
    """Seeded inputs of one rope_kv_write call.

    qkv ~ N(0, 1) with a per-head gain in [0.5, 4] (QKV projection outputs; bias makes some heads larger);
    positions uniform over [0, max_positions) with the first token at 0 and, from 2 tokens, one at
    max_positions - 1 (the cache's ends); slots distinct, drawn from a shuffled cache of ceil(T / 64) + 3
    blocks (so blocks are non-contiguous and some stay unwritten); the cache pre-filled with garbage
    (`garbage_cache`). fp8: k_scale = 16 / 448, v_scale = 12 / 448, so the largest values saturate.
    Graph-padding rows hold slot -1 and position 0 (the Op's padding_values).
    """
    hq, hkv = _heads(dims)
    max_positions = int(dims.get("max_positions", GPT_OSS_ROPE["max_position_embeddings"]))
    gen = torch.Generator().manual_seed(seed)
    gain = 0.5 + 3.5 * torch.rand(hq + 2 * hkv, 1, generator=gen)
    qkv = (torch.randn(tokens, hq + 2 * hkv, HEAD_DIM, generator=gen) * gain).reshape(tokens, -1)
    positions = torch.randint(0, max_positions, (tokens,), generator=gen, dtype=torch.int64)
    if tokens:
        positions[0] = 0
    if tokens > 1:
        positions[-1] = max_positions - 1
    num_blocks = -(-tokens // BLOCK_SIZE) + 3
    slot_mapping = torch.randperm(num_blocks * BLOCK_SIZE, generator=gen)[:tokens].to(torch.int64)
    dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
    inputs = {
        "qkv": qkv.to(torch.bfloat16),
        "positions": positions,
        "cos_sin_cache": build_cos_sin_cache(HEAD_DIM, max_positions),
        "slot_mapping": slot_mapping,
        "key_cache": garbage_cache(num_blocks, hkv, dtype, gen),
        "value_cache": garbage_cache(num_blocks, hkv, dtype, gen),
    }
    if fp8:
        # |k| reaches ~20 (gain 4 x 4 sigma x mscale), |v| ~16: the largest values saturate.
        inputs["k_scale"] = torch.tensor([16.0 / FP8_MAX], dtype=torch.float32)
        inputs["v_scale"] = torch.tensor([12.0 / FP8_MAX], dtype=torch.float32)
    return inputs


def _as_float(outputs) -> tuple[torch.Tensor, ...]:
    return tuple(t.float() for t in outputs)


_ROWS = ("qkv", "positions", "slot_mapping")
_PADDING = (("positions", 0), ("slot_mapping", -1))
_MUTATES = ("key_cache", "value_cache")

OPS = (
    Op("rope_kv_write", rope_kv_write, lambda t, d, s: build_rope_inputs(t, d, s),
       _as_float, ("q",), COSINE_MIN, _ROWS, mutates=_MUTATES, padding_values=_PADDING),
    Op("rope_kv_write_fp8", rope_kv_write_fp8, lambda t, d, s: build_rope_inputs(t, d, s, fp8=True),
       _as_float, ("q",), COSINE_MIN, _ROWS, mutates=_MUTATES, padding_values=_PADDING),
)


# ---------------------------------------------------------------- op 2: paged attention

CONTEXT_LENGTHS = (1, 2, 63, 64, 65, 127, 128, 129, 1000, 8192, 32768, 131072)
# Lengths from here up enter a built batch at most once each (a 131072-key sequence is 256 MiB of cache at TP1).
LONG_CONTEXT = 8192
PAGED_COSINE_MIN = 0.9995
_QUERY_CHUNK = 256  # query rows per fp64 score matrix in the reference


def paged_attention(q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                    cu_seqlens_q: torch.Tensor, seq_lens: torch.Tensor, block_table: torch.Tensor,
                    sinks: torch.Tensor, sliding_window: int) -> tuple[torch.Tensor]:
    """-> (out bf16 [T, Hq, 64],): causal paged attention with sinks and an optional sliding window.

    One reference for the whole mixed batch (decode and prefill rows), as vLLM's attention layer calls its
    backend (vllm/model_executor/models/gpt_oss.py `OAIAttention`, the ROCm / Triton unified attention kernel):
    - Heads: Hq query heads, Hkv KV heads (gpt-oss-120b: 64 / 8 at TP1, 8 / 1 at TP8: always 8 query heads per
      KV head), head_dim 64, softmax scale 64**-0.5 (`self.scaling = head_dim ** -0.5`).
    - q bf16 [T, Hq, 64], the rotated queries, token rows of every sequence back to back.
    - key_cache, value_cache bf16 [num_blocks, 64, Hkv, 64]: vLLM's flash layout, block_size 64 (the MI355X
      recipe); key j of sequence b lives in block block_table[b, j // 64], slot j % 64.
    - cu_seqlens_q int32 [B + 1] (non-decreasing, cu_seqlens_q[0] = 0): sequence b owns query rows
      cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1 (q_len_b of them).
    - seq_lens int32 [B]: keys of sequence b, its new tokens included (vLLM's seqused_k); q_len_b <= seq_lens[b].
    - block_table int32 [B, max_blocks]; entries past a sequence's ceil(seq_len / 64) blocks are never read.
    - sinks fp32 [Hq]: the learned sink logits (bf16 in the checkpoint, read as fp32; one per query head, TP
      ranks hold their heads' slice).
    - sliding_window: 0 = full attention; W > 0 keeps key k for query position p when p - k < W (vLLM's
      convention: its layers pass window_size = (W - 1, 0) and the kernels test (p - k) < W). gpt-oss: even
      layers W = 128 (`layer_idx % 2 == 0`), odd layers full attention.
    - Query i of sequence b sits at position p = seq_lens[b] - q_len_b + i; causal: keys k <= p.
    - Softmax with the sink, per query row and head, s_k = scale * q . k:
          m = max(sink, max_k s_k),  p_k = exp(s_k - m) / (exp(sink - m) + sum_k exp(s_k - m)),
          out = sum_k p_k v_k.
      The sink enters the denominator exactly once (a kernel that splits the keys adds it in one split only)
      and adds nothing to the numerator.
    - Graph padding: query rows past cu_seqlens_q[-1] belong to no sequence, and sequences with q_len 0 (and
      seq_len 0) are padding; their rows' outputs are unspecified (this reference writes zeros). A kernel must
      read nothing out of range for them and write nothing into real rows.
    - Output: out bf16 [T, Hq, 64].

    Where the kernels round (this reference computes exactly, in fp64, and rounds only the output):
    - scores s = q . k are bf16 products accumulated in fp32 (MFMA), then scaled by scale * log2(e) in fp32 and
      exponentiated with exp2 (online softmax in fp32, running max per head);
    - the probabilities p are rounded to bf16 before P V (bf16 MFMA, fp32 accumulate);
    - the running sums, the split merge (fixed split order) and the final division are fp32; out is rounded
      to bf16 once, round to nearest even.
    Tiers (chosen per sequence from its own q_len, never from the batch): q_len 1 -> the decode tier, whose
    split over keys depends only on the sequence's length (partials merged in split order); q_len > 1 -> the
    prefill tier, one pass per Q tile over the keys in increasing 64-key blocks, no split:
    - a Q tile is 32 consecutive query rows of one sequence (from its first row on) times the 8 query heads of
      one KV head; its scores per 64-key block are bf16 MFMA products accumulated in fp32 over the 64 dims,
      scaled by scale * log2(e) in fp32; keys outside the causal / window range become -inf;
    - the running max m per (row, head) starts at sink * log2(e) (fp32) and is updated once per block; O and
      the per-lane partial sums are rescaled by exp2(m_old - m_new) (fp32); p = exp2(s - m) in fp32;
    - p rounded to bf16 (round to nearest even) before P V, which accumulates in fp32 over the block's keys;
    - at the end l = the 4 partial sums (fixed order) + exp2(sink * log2(e) - m), out = O * (1 / l) in fp32,
      rounded to bf16 once.
    Tolerance: cosine of out against this reference >= 0.9995 (the bf16 rounding of p is the largest term),
    for both tiers, and the kernel bitwise deterministic and batch invariant (a sequence's output bits do not
    depend on the other sequences of the batch: its tier, its split over keys and its Q tiles depend only on
    its own lengths).

    Computed in fp64 per (sequence, KV head), rounded to bf16 once."""
    return _paged_attention(q, key_cache, value_cache, cu_seqlens_q, seq_lens, block_table, sinks,
                            sliding_window, None, None, round_p=False)


def paged_attention_fp8(q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                        cu_seqlens_q: torch.Tensor, seq_lens: torch.Tensor, block_table: torch.Tensor,
                        sinks: torch.Tensor, sliding_window: int, k_scale: torch.Tensor, v_scale: torch.Tensor
                        ) -> tuple[torch.Tensor]:
    """paged_attention over the fp8 tier of the KV cache -> (out bf16 [T, Hq, 64],).

    key_cache / value_cache float8_e4m3fn [num_blocks, 64, Hkv, 64] (what rope_kv_write_fp8 writes), k_scale /
    v_scale fp32 [1] (per tensor, vLLM's layer._k_scale / _v_scale); every other argument as paged_attention.
    - Dequantization (the contract's rule, module docstring): key = code * k_scale, value = code * v_scale.
      This reference computes it exactly (fp64) and then the same attention as paged_attention.
    - Where the kernels round: each E4M3 code converts to bf16 exactly (every E4M3 value, NaN included, is a
      bf16 value), so Q K^T runs on the codes with bf16 products accumulated in fp32 (MFMA), and the scale is
      applied to the fp32 score: s = (q . code_k) * (k_scale * 64**-0.5 * log2 e), that constant one fp32
      product. P is rounded to bf16 and multiplies the V codes (bf16 MFMA, fp32 accumulate); the fp32 O is
      multiplied by v_scale in fp32 before the final division (one split) or before it is written as a
      split partial (the merge is the bf16 tier's). No other rounding than paged_attention's.
    - Tolerance: cosine >= 0.9995 against this reference (as paged_attention: the fp8 codes are inputs here,
      so their quantization error is not part of the comparison), bitwise deterministic, batch invariant.
    - A NaN code or a saturated +-448 in a slot no query reads must never reach an output (the input builder
      puts them there)."""
    return _paged_attention(q, key_cache, value_cache, cu_seqlens_q, seq_lens, block_table, sinks,
                            sliding_window, k_scale, v_scale, round_p=False)


def paged_attention_p_bf16(q, key_cache, value_cache, cu_seqlens_q, seq_lens, block_table, sinks,
                           sliding_window) -> tuple[torch.Tensor]:
    """paged_attention with the kernels' largest rounding point put back: each p_k = exp(s_k - m) rounded to
    bf16 before P V (the denominator keeps the unrounded p, as the kernels' fp32 running sum does; m the row's
    final max where the kernels use a running block max: the same relative rounding, another realization).
    Not an op: the layer's chain bound (references/layer.py) runs the reference chain with it."""
    return _paged_attention(q, key_cache, value_cache, cu_seqlens_q, seq_lens, block_table, sinks,
                            sliding_window, None, None, round_p=True)


def _paged_attention(q, key_cache, value_cache, cu_seqlens_q, seq_lens, block_table, sinks, sliding_window,
                     k_scale, v_scale, round_p: bool) -> tuple[torch.Tensor]:
    """The fp64 computation of both KV tiers: k_scale / v_scale None for bf16 caches, else the dequant
    factors; round_p puts the kernels' P-to-bf16 rounding back (paged_attention_p_bf16)."""
    ks = 1.0 if k_scale is None else float(k_scale.double().reshape(()))
    vs = 1.0 if v_scale is None else float(v_scale.double().reshape(()))
    T, Hq, D = q.shape
    Hkv = key_cache.shape[2]
    G = Hq // Hkv
    cu = cu_seqlens_q.tolist()
    lens = seq_lens.tolist()
    out = torch.zeros(T, Hq, D, dtype=torch.bfloat16)
    sink = sinks.to(torch.float64).view(Hkv, G)
    for b, L in enumerate(lens):
        q0, q1 = cu[b], cu[b + 1]
        ql = q1 - q0
        if ql == 0:
            continue
        if ql > L:
            raise ValueError(f"seq_lens: sequence {b} has {ql} query rows but only {L} keys")
        first = 0
        if sliding_window:
            first = max(0, L - ql - sliding_window + 1)  # the earliest key the first query keeps
        blocks = block_table[b, first // BLOCK_SIZE: -(-L // BLOCK_SIZE)].long()
        start = first - (first // BLOCK_SIZE) * BLOCK_SIZE
        span = L - first
        kpos = torch.arange(first, L)
        k_all = key_cache[blocks].reshape(-1, Hkv, D)[start:start + span]
        v_all = value_cache[blocks].reshape(-1, Hkv, D)[start:start + span]
        for h in range(Hkv):
            k = k_all[:, h].to(torch.float64) * ks
            v = v_all[:, h].to(torch.float64) * vs
            for c0 in range(0, ql, _QUERY_CHUNK):
                c1 = min(ql, c0 + _QUERY_CHUNK)
                p0, p1 = L - ql + c0, L - ql + c1  # the chunk's query positions [p0, p1)
                # only keys in [lo, p1) can count for this chunk (causal; the window from its first row)
                lo = max(first, p0 - sliding_window + 1) if sliding_window else first
                kc, vc = k[lo - first:p1 - first], v[lo - first:p1 - first]
                qpos = torch.arange(p0, p1)
                kp = kpos[lo - first:p1 - first]
                keep = kp[None, :] <= qpos[:, None]
                if sliding_window:
                    keep &= (qpos[:, None] - kp[None, :]) < sliding_window
                qq = q[q0 + c0:q0 + c1, h * G:(h + 1) * G].to(torch.float64).transpose(0, 1)  # [G, rows, D]
                # in place: the score matrix is the reference's largest temporary (G x 256 x keys fp64)
                p = (qq.reshape(-1, D) @ kc.T).view(G, c1 - c0, -1).mul_(SCALE)
                p.masked_fill_(~keep[None], -math.inf)
                sk = sink[h].view(G, 1, 1)
                m = torch.maximum(p.amax(dim=-1, keepdim=True), sk)
                p.sub_(m).exp_()
                denom = p.sum(dim=-1, keepdim=True) + torch.exp(sk - m)
                if round_p:
                    p = p.to(torch.bfloat16).to(torch.float64)
                o = (p.div_(denom).reshape(G * (c1 - c0), -1) @ vc).view(G, c1 - c0, D).transpose(0, 1)
                out[q0 + c0:q0 + c1, h * G:(h + 1) * G] = o.to(torch.bfloat16)
    return (out,)


def _garbage(shape, gen) -> torch.Tensor:
    """NaN, +-65504 and 1e4-scale noise, mixed: what a kernel must never let reach an output."""
    pattern = torch.tensor([float("nan"), 65504.0, -65504.0, float("nan")])
    kind = torch.randint(0, 5, shape, generator=gen)
    noise = torch.randn(shape, generator=gen) * 1e4
    return torch.where(kind == 4, noise, pattern[kind.clamp(max=3)]).to(torch.bfloat16)


def _pool_starts(blocks: int, per_block: int, pool: torch.Tensor, gen) -> torch.Tensor:
    """The seeded pool offsets of `blocks` cache blocks: block j's values are pool[s_j : s_j + per_block]
    (distinct blocks, cheap to build)."""
    return torch.randint(0, pool.numel() - per_block + 1, (blocks,), generator=gen)


def _build_cache(num_blocks: int, garbage: torch.Tensor, fills: list, pool: torch.Tensor) -> torch.Tensor:
    """A cache [num_blocks, 64, hkv, 64] of garbage's dtype holding `garbage` (one block's worth) in every slot
    but the first `keys` slots of each fill's blocks (fills: (block ids in order, their pool offsets, keys)),
    which hold their pool windows. Every slot is written once: the garbage blocks, then each fill's windows,
    then the garbage tail of its last block. Only copies, so an elementwise map of pool and garbage (fp8
    quantization) gives the map of the cache."""
    per_block = garbage.numel()
    cache = torch.empty((num_blocks, *garbage.shape), dtype=garbage.dtype)
    flat = cache.view(num_blocks, per_block)
    garbage_blocks = torch.ones(num_blocks, dtype=torch.bool)
    for ids, _, _ in fills:
        garbage_blocks[ids] = False
    flat[garbage_blocks] = garbage.reshape(-1)
    for ids, starts, keys in fills:
        if not len(ids):
            continue
        for blk, s in zip(ids.tolist(), starts.tolist()):  # one copy a block (faster than a gather + scatter)
            flat[blk] = pool[s:s + per_block]
        last = keys - (len(ids) - 1) * BLOCK_SIZE  # 1 .. 64 slots of the last block hold values
        cache[int(ids[-1]), last:] = garbage[last:]
    return cache


def context_lengths_of(batch: int, dims: dict, seed: int) -> list[int]:
    """Seeded context lengths of `batch` decode sequences: the regime's list in a seeded order, each
    length >= LONG_CONTEXT at most once per batch, the rest cycling through the shorter ones. A list of
    one length gives every sequence that length (the benchmarks' uniform batches)."""
    lengths = [int(n) for n in dims.get("context_lengths", CONTEXT_LENGTHS)]
    if len(set(lengths)) == 1:
        return lengths[:1] * batch
    gen = torch.Generator().manual_seed(seed)
    order = [lengths[i] for i in torch.randperm(len(lengths), generator=gen).tolist()]
    short = [n for n in order if n < LONG_CONTEXT] or [1]
    out = order[:batch]
    while len(out) < batch:
        out.append(short[len(out) % len(short)])
    return out


# Query lengths a prefill batch includes first (the regime's lengths around the 32-token Q tile and the
# 64-key block): 1 goes to the decode tier inside a prefill batch.
PREFILL_ODD_LENGTHS = (1, 63, 65, 127, 129)


def prefill_batch_of(tokens: int, dims: dict, seed: int) -> tuple[list[int], list[int]]:
    """(q_lens, seq_lens) of a seeded prefill / chunked-prefill batch of `tokens` query rows:
    dims["prefill_sequences"] sequences share tokens - decode_sequences new tokens, the first ones taking
    PREFILL_ODD_LENGTHS (seeded order) while they fit, the others a seeded uneven split of the rest; each
    prefill sequence has a cached prefix from dims["cached_prefix"] (cycled from a seeded start; 0 = none);
    dims["decode_sequences"] decode sequences (q_len 1, context lengths from dims["context_lengths"] up to
    LONG_CONTEXT) sit between them (fewer of both when `tokens` is too small). dims["prefill_uniform"] (benchmarks): equal lengths, cached_prefix[0]."""
    S = int(dims["prefill_sequences"])
    D = int(dims.get("decode_sequences", 0))
    prefixes = [int(p) for p in dims.get("cached_prefix", [0])]
    contexts = [int(n) for n in dims.get("context_lengths", CONTEXT_LENGTHS) if int(n) <= LONG_CONTEXT] or [1]
    if S < 1 or D < 0 or tokens < 1:
        raise ValueError(f"dims: {S} prefill and {D} decode sequences, {tokens} query rows")
    D = min(D, (tokens - 1) // 2)  # a batch too small for the layout keeps fewer sequences
    S = min(S, tokens - D)
    new = tokens - D
    if dims.get("prefill_uniform"):  # benchmarks: S equal sequences (the last takes the remainder), one prefix
        q_lens = [new // S] * (S - 1) + [new - (new // S) * (S - 1)]
        return q_lens + [1] * D, [q + prefixes[0] for q in q_lens] + [contexts[0]] * D
    gen = torch.Generator().manual_seed(seed)
    odd = [PREFILL_ODD_LENGTHS[i] for i in torch.randperm(len(PREFILL_ODD_LENGTHS), generator=gen).tolist()]
    q_lens: list[int] = []
    left = new
    for n in odd[:S - 1]:
        if n + (S - len(q_lens) - 1) * 2 <= left:  # the others keep at least 2 rows each
            q_lens.append(n)
            left -= n
    rest = S - len(q_lens)
    cuts = sorted(torch.randperm(left - 1, generator=gen)[:rest - 1].add(1).tolist()) if rest > 1 else []
    q_lens += [b - a for a, b in zip([0] + cuts, cuts + [left])]
    start = int(torch.randint(0, len(prefixes), (1,), generator=gen))
    seq_lens = [q + prefixes[(start + i) % len(prefixes)] for i, q in enumerate(q_lens)]
    for j in range(D):  # decode sequences spread through the batch
        at = (j * (S + j)) // max(D, 1) + j
        L = contexts[int(torch.randint(0, len(contexts), (1,), generator=gen))]
        q_lens.insert(at, 1)
        seq_lens.insert(at, L)
    return q_lens, seq_lens


def build_paged_attention_inputs(tokens: int, dims: dict, seed: int, *, seq_lens: list[int] | None = None,
                                 q_lens: list[int] | None = None, kv_scales: tuple | None = None) -> dict:
    """Seeded inputs of one batch, vLLM's layouts. Default: a decode batch of `tokens` sequences (q_len 1)
    with context lengths from context_lengths_of(); dims with "prefill_sequences" give a prefill batch
    (prefill_batch_of); `seq_lens` / `q_lens` give any mixed batch.

    The cache holds only the blocks the batch uses plus ~1/8 more, in a seeded shuffled order (block ids
    are not contiguous and no block serves two sequences). Unused blocks, the slots past each sequence's
    last key and, in window layers, blocks wholly before the window (vLLM points those at its null block:
    here one shared garbage block) hold garbage (NaN, +-65504, 1e4 noise). Block table entries past a
    sequence's blocks name garbage blocks. q ~ 1.5 N(0, 1), k, v ~ N(0, 1), sinks ~ N(0, 2) rounded to bf16.
    `kv_scales` (k_scale, v_scale): the caches hold quantize_fp8 of those values (build_paged_attention_fp8_inputs).
    """
    Hq = int(dims.get("query_heads", 64))
    Hkv = int(dims.get("kv_heads", 8))
    D = int(dims.get("head_dim", HEAD_DIM))
    window = int(dims.get("sliding_window", 0))
    if D != HEAD_DIM or Hq % Hkv:
        raise ValueError(f"dims: head_dim must be {HEAD_DIM} and query_heads a multiple of kv_heads: {dims}")
    if seq_lens is None and "prefill_sequences" in dims:
        q_lens, seq_lens = prefill_batch_of(tokens, dims, seed)
    if seq_lens is None:
        seq_lens = context_lengths_of(tokens, dims, seed)
    q_lens = [1] * len(seq_lens) if q_lens is None else list(q_lens)
    B = len(seq_lens)
    T = sum(q_lens)
    if T > tokens or any(ql > L for ql, L in zip(q_lens, seq_lens)):
        raise ValueError(f"q_lens {q_lens} do not fit {tokens} rows / seq_lens {seq_lens}")
    gen = torch.Generator().manual_seed(seed + 1)
    n_blocks = [-(-L // BLOCK_SIZE) for L in seq_lens]
    # blocks wholly before every query's window are never read: they map to one shared garbage block
    first_live = [max(0, L - ql - window + 1) // BLOCK_SIZE if window else 0 for L, ql in zip(seq_lens, q_lens)]
    live = sum(n - f for n, f in zip(n_blocks, first_live))
    spare = live // 8 + 2
    num_blocks = live + spare
    perm = torch.randperm(num_blocks, generator=gen)
    garbage_ids = perm[live:]
    max_blocks = max(n_blocks + [1]) + 2
    block_table = garbage_ids[torch.randint(0, spare, (B, max_blocks), generator=gen)].to(torch.int32)
    # N(0, 1) values: each block a window of a random pool at a random offset (distinct blocks, cheap to build)
    pool = torch.randn(max(1 << 22, 2 * BLOCK_SIZE * Hkv * D), generator=gen).to(torch.bfloat16)
    garbage = [_garbage((BLOCK_SIZE, Hkv, D), gen) for _ in range(2)]  # K's, V's
    fills = ([], [])
    nxt = 0
    for b, (L, n, f) in enumerate(zip(seq_lens, n_blocks, first_live)):
        ids = perm[nxt:nxt + n - f].long()
        nxt += n - f
        block_table[b, f:n] = ids.to(torch.int32)
        block_table[b, :f] = int(garbage_ids[0])
        filled = L - f * BLOCK_SIZE  # keys held by this sequence's live blocks (the rest stay garbage)
        for c in range(2):  # K's offsets, then V's (the draw order fixes the values)
            fills[c].append((ids, _pool_starts(len(ids), garbage[c].numel(), pool, gen), filled))
    if kv_scales is None:
        key_cache, value_cache = (_build_cache(num_blocks, garbage[c], fills[c], pool) for c in range(2))
    else:  # quantized before the copies: the same bytes as quantizing the built cache, at the pool's size
        key_cache, value_cache = (_build_cache(num_blocks, quantize_fp8(garbage[c], scale), fills[c],
                                               quantize_fp8(pool, scale)) for c, scale in enumerate(kv_scales))
    q = (1.5 * torch.randn(tokens, Hq, D, generator=gen)).to(torch.bfloat16)
    cu = torch.zeros(B + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(q_lens, dtype=torch.int32).cumsum(0)
    sinks = (2.0 * torch.randn(Hq, generator=gen)).to(torch.bfloat16).float()
    return {"q": q, "key_cache": key_cache, "value_cache": value_cache, "cu_seqlens_q": cu,
            "seq_lens": torch.tensor(seq_lens, dtype=torch.int32), "block_table": block_table,
            "sinks": sinks, "sliding_window": window}


# fp8 tier scales: not powers of two, so a kernel that drops or misplaces one fails; N(0, 1) values beyond
# 4.5 (k) / 4 (v) saturate to +-448.
FP8_K_SCALE = 4.5 / FP8_MAX
FP8_V_SCALE = 4.0 / FP8_MAX


def build_paged_attention_fp8_inputs(tokens: int, dims: dict, seed: int, **kw) -> dict:
    """build_paged_attention_inputs with the cache on the fp8 tier: every slot (values and garbage alike)
    becomes e4m3(x / scale) (`quantize_fp8`: garbage NaN stays the NaN code, +-65504 and the noise saturate to
    +-448), k_scale = 4.5 / 448 and v_scale = 4 / 448 fp32 [1]."""
    k_scale = torch.tensor([FP8_K_SCALE], dtype=torch.float32)
    v_scale = torch.tensor([FP8_V_SCALE], dtype=torch.float32)
    inputs = build_paged_attention_inputs(tokens, dims, seed, kv_scales=(k_scale, v_scale), **kw)
    inputs.update(k_scale=k_scale, v_scale=v_scale)
    return inputs


def pad_paged_attention(inputs: dict, real: int) -> dict:
    """A decode batch run at a larger capture size, as vLLM pads it: sequences real.. become padding
    (q_len 0, seq_len 0; cu_seqlens_q repeats its last value) and query rows real.. belong to no one."""
    out = dict(inputs)
    cu = inputs["cu_seqlens_q"].clone()
    lens = inputs["seq_lens"].clone()
    B = lens.shape[0]
    if real < B:
        last = int(cu[real])
        cu[real + 1:] = last
        lens[real:] = 0
    out.update(cu_seqlens_q=cu, seq_lens=lens)
    return out


def sub_batch_paged_attention(inputs: dict, rows: list[int]) -> tuple[dict, list[int]]:
    """The sequences owning query rows `rows`, alone (same cache, same blocks): for the batch-invariance
    check. -> (their inputs, the full batch's rows that the sub-batch's rows 0, 1, ... correspond to)."""
    cu = inputs["cu_seqlens_q"].tolist()
    seqs = sorted({b for r in rows for b in range(len(cu) - 1) if cu[b] <= r < cu[b + 1]})
    full_rows = [r for b in seqs for r in range(cu[b], cu[b + 1])]
    sub_cu = torch.zeros(len(seqs) + 1, dtype=torch.int32)
    sub_cu[1:] = torch.tensor([cu[b + 1] - cu[b] for b in seqs], dtype=torch.int32).cumsum(0)
    idx = torch.tensor(seqs, dtype=torch.long)
    sub = dict(inputs)
    sub.update(q=inputs["q"][torch.tensor(full_rows, dtype=torch.long)].contiguous(), cu_seqlens_q=sub_cu,
               seq_lens=inputs["seq_lens"][idx].contiguous(), block_table=inputs["block_table"][idx].contiguous())
    return sub, full_rows


OPS = OPS + (
    Op("paged_attention", paged_attention, build_paged_attention_inputs,
       lambda outputs: (outputs[0].float(),), ("out",), PAGED_COSINE_MIN, ("q",),
       pad_inputs=pad_paged_attention, sub_batch=sub_batch_paged_attention),
    Op("paged_attention_fp8", paged_attention_fp8, build_paged_attention_fp8_inputs,
       lambda outputs: (outputs[0].float(),), ("out",), PAGED_COSINE_MIN, ("q",),
       pad_inputs=pad_paged_attention, sub_batch=sub_batch_paged_attention),
)
