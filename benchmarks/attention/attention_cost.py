"""The minimum cost of paged attention: decode batches (every K/V byte a query needs read once, the last
`sliding_window` keys in window layers, q read and out written once, the metadata and sinks read once) and
prefill batches (the causal / window triangle of MFMA work)."""

from __future__ import annotations

from benchmarks.runner import Cost

HEAD_DIM = 64
BLOCK = 64
# v_mfma_f32_16x16x32_bf16: 16 * 16 * 32 multiply-adds
MFMA_MACS = 16 * 16 * 32


# the floor's compute rate: dense bf16 MFMA on MI355X (issue 13's 2.5 PFLOP/s)
BF16_FLOPS_PER_S = 2.5e15

def paged_decode_cost(batch: int, dims: dict, kv_bytes: int = 2) -> Cost:
    """kv_bytes: bytes per cached element (2: bf16 tier; 1: fp8 tier, which also reads k_scale and v_scale)."""
    hq, hkv = int(dims["query_heads"]), int(dims["kv_heads"])
    window = int(dims.get("sliding_window", 0))
    (length,) = set(int(n) for n in dims["context_lengths"])  # a uniform batch
    keys = min(length, window) if window else length
    kv = batch * keys * hkv * HEAD_DIM * 2 * kv_bytes + (8 if kv_bytes == 1 else 0)
    qo = 2 * batch * hq * HEAD_DIM * 2
    meta = (batch + 1) * 4 + batch * 4 + batch * -(-keys // BLOCK) * 4 + hq * 4
    macs = 2 * batch * hq * keys * HEAD_DIM  # Q K^T and P V
    return Cost(kv + qo + meta, 2 * macs, -(-macs // MFMA_MACS), min_write_bytes=batch * hq * HEAD_DIM * 2,
                flops_per_s=BF16_FLOPS_PER_S)



def prefill_keys(q_len: int, seq_len: int, window: int) -> int:
    """Keys the q_len query rows of one sequence keep in total (causal, window p - k < W)."""
    first = seq_len - q_len
    return sum(min(p + 1, window) if window else p + 1 for p in range(first, seq_len))


def paged_prefill_cost(tokens: int, dims: dict) -> Cost:
    """A prefill batch (references.attention.prefill_batch_of): MFMA work of the causal / window triangle
    (not the square), every K/V byte the batch needs read once, q read and out written once."""
    from references.attention import prefill_batch_of

    hq, hkv = int(dims["query_heads"]), int(dims["kv_heads"])
    window = int(dims.get("sliding_window", 0))
    q_lens, seq_lens = prefill_batch_of(tokens, dims, 0)
    kept = sum(prefill_keys(q, L, window) for q, L in zip(q_lens, seq_lens))
    needed = sum(min(L, q + window - 1) if window else L for q, L in zip(q_lens, seq_lens))  # distinct keys
    kv = needed * hkv * HEAD_DIM * 2 * 2
    qo = 2 * sum(q_lens) * hq * HEAD_DIM * 2
    meta = 2 * len(q_lens) * 4 + 4 + sum(-(-L // BLOCK) for L in seq_lens) * 4 + hq * 4
    macs = 2 * kept * hq * HEAD_DIM  # Q K^T and P V
    return Cost(kv + qo + meta, 2 * macs, -(-macs // MFMA_MACS), min_write_bytes=sum(q_lens) * hq * HEAD_DIM * 2,
                flops_per_s=BF16_FLOPS_PER_S)


def flashinfer_anchors(dims: dict) -> list[dict]:
    """Issue 12's anchor for a package's --plot: FlashInfer reaches 5.83 TB/s on B200 at 64 sequences x 4096
    keys with sinks (a bandwidth on another GPU, not an MI355X time), as this shape's minimum bytes at that
    bandwidth, in us."""
    cost = paged_decode_cost(64, {**dims, "context_lengths": [4096], "sliding_window": 0})
    return [{"tokens": 64, "us": round(cost.min_bytes / 5.83e12 * 1e6, 2),
             "label": "64 seq x 4096 keys at FlashInfer's B200 5.83 TB/s (issue 12)"}]
