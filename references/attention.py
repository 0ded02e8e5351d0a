"""gpt-oss attention between the QKV and O projections (vLLM's layouts, as its gpt-oss model calls them).

# Op 2, paged attention (`paged_attention`)

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
Tolerance: cosine of out against this reference >= 0.9995 (the bf16 rounding of p is the largest term),
and the kernel bitwise deterministic and batch invariant (a sequence's output bits do not depend on the
other sequences of the batch: its split over keys depends only on its own length).
"""

from __future__ import annotations

import math

import torch

from references.op import Op

HEAD_DIM = 64
BLOCK_SIZE = 64
SOFTMAX_SCALE = HEAD_DIM ** -0.5
# The context lengths the harness mixes into a batch when a regime lists none.
CONTEXT_LENGTHS = (1, 2, 63, 64, 65, 127, 128, 129, 1000, 8192, 32768, 131072)
# Lengths from here up enter a built batch at most once each (a 131072-key sequence is 256 MiB of cache at TP1).
LONG_CONTEXT = 8192
COSINE_MIN = 0.9995
_QUERY_CHUNK = 256  # query rows per fp64 score matrix in the reference


def paged_attention(q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                    cu_seqlens_q: torch.Tensor, seq_lens: torch.Tensor, block_table: torch.Tensor,
                    sinks: torch.Tensor, sliding_window: int) -> tuple[torch.Tensor]:
    """-> (out bf16 [T, Hq, 64],): causal paged attention with sinks and an optional sliding window (see the
    module docstring). Computed in fp64 per (sequence, KV head), rounded to bf16 once."""
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
            k = k_all[:, h].to(torch.float64)
            v = v_all[:, h].to(torch.float64)
            for c0 in range(0, ql, _QUERY_CHUNK):
                c1 = min(ql, c0 + _QUERY_CHUNK)
                qpos = torch.arange(L - ql + c0, L - ql + c1)
                keep = kpos[None, :] <= qpos[:, None]
                if sliding_window:
                    keep &= (qpos[:, None] - kpos[None, :]) < sliding_window
                qq = q[q0 + c0:q0 + c1, h * G:(h + 1) * G].to(torch.float64).transpose(0, 1)  # [G, rows, D]
                s = (qq.reshape(-1, D) @ k.T).view(G, c1 - c0, -1) * SOFTMAX_SCALE
                s = s.masked_fill(~keep[None], -math.inf)
                sk = sink[h].view(G, 1, 1)
                m = torch.maximum(s.amax(dim=-1, keepdim=True), sk)
                p = torch.exp(s - m)
                denom = p.sum(dim=-1, keepdim=True) + torch.exp(sk - m)
                o = ((p / denom).reshape(G * (c1 - c0), -1) @ v).view(G, c1 - c0, D).transpose(0, 1)
                out[q0 + c0:q0 + c1, h * G:(h + 1) * G] = o.to(torch.bfloat16)
    return (out,)


def _garbage(shape, gen) -> torch.Tensor:
    """NaN, +-65504 and 1e4-scale noise, mixed: what a kernel must never let reach an output."""
    pattern = torch.tensor([float("nan"), 65504.0, -65504.0, float("nan")])
    kind = torch.randint(0, 5, shape, generator=gen)
    noise = torch.randn(shape, generator=gen) * 1e4
    return torch.where(kind == 4, noise, pattern[kind.clamp(max=3)]).to(torch.bfloat16)


def _fill_blocks(cache: torch.Tensor, ids: list[int], keys: int, pool: torch.Tensor, gen) -> None:
    """The first `keys` slots of blocks `ids` (in order) of `cache` [num_blocks, 64, hkv, 64] <- N(0, 1)
    bf16 values: block j gets pool[s_j : s_j + its element count], s_j seeded uniform (distinct blocks)."""
    per_block = cache[0].numel()
    starts = torch.randint(0, pool.numel() - per_block + 1, (len(ids),), generator=gen).tolist()
    for j, (blk, s) in enumerate(zip(ids, starts)):
        n = min(BLOCK_SIZE, keys - j * BLOCK_SIZE)
        cache[blk, :n] = pool[s:s + per_block].view(cache.shape[1:])[:n]


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


def build_paged_attention_inputs(tokens: int, dims: dict, seed: int, *, seq_lens: list[int] | None = None,
                                 q_lens: list[int] | None = None) -> dict:
    """Seeded inputs of one batch, vLLM's layouts. Default: a decode batch of `tokens` sequences (q_len 1)
    with context lengths from context_lengths_of(); `seq_lens` / `q_lens` give any mixed batch.

    The cache holds only the blocks the batch uses plus ~1/8 more, in a seeded shuffled order (block ids
    are not contiguous and no block serves two sequences). Unused blocks, the slots past each sequence's
    last key and, in window layers, blocks wholly before the window (vLLM points those at its null block:
    here one shared garbage block) hold garbage (NaN, +-65504, 1e4 noise). Block table entries past a
    sequence's blocks name garbage blocks. q ~ 1.5 N(0, 1), k, v ~ N(0, 1), sinks ~ N(0, 2) rounded to bf16.
    """
    Hq = int(dims.get("query_heads", 64))
    Hkv = int(dims.get("kv_heads", 8))
    D = int(dims.get("head_dim", HEAD_DIM))
    window = int(dims.get("sliding_window", 0))
    if D != HEAD_DIM or Hq % Hkv:
        raise ValueError(f"dims: head_dim must be {HEAD_DIM} and query_heads a multiple of kv_heads: {dims}")
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
    caches = [_garbage((BLOCK_SIZE, Hkv, D), gen).expand(num_blocks, -1, -1, -1).clone() for _ in range(2)]
    nxt = 0
    for b, (L, n, f) in enumerate(zip(seq_lens, n_blocks, first_live)):
        ids = perm[nxt:nxt + n - f].long()
        nxt += n - f
        block_table[b, f:n] = ids.to(torch.int32)
        block_table[b, :f] = int(garbage_ids[0])
        filled = L - f * BLOCK_SIZE  # keys held by this sequence's live blocks (the rest stay garbage)
        for cache in caches:
            _fill_blocks(cache, ids.tolist(), filled, pool, gen)
    key_cache, value_cache = caches
    q = (1.5 * torch.randn(tokens, Hq, D, generator=gen)).to(torch.bfloat16)
    cu = torch.zeros(B + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(q_lens, dtype=torch.int32).cumsum(0)
    sinks = (2.0 * torch.randn(Hq, generator=gen)).to(torch.bfloat16).float()
    return {"q": q, "key_cache": key_cache, "value_cache": value_cache, "cu_seqlens_q": cu,
            "seq_lens": torch.tensor(seq_lens, dtype=torch.int32), "block_table": block_table,
            "sinks": sinks, "sliding_window": window}


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


OPS = (
    Op("paged_attention", paged_attention, build_paged_attention_inputs,
       lambda outputs: (outputs[0].float(),), ("out",), COSINE_MIN, ("q",),
       pad_inputs=pad_paged_attention, sub_batch=sub_batch_paged_attention),
)
