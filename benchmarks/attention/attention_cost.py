"""The minimum cost of a decode batch of paged attention: every K/V byte a query needs read once (the last
`sliding_window` keys in window layers), q read and out written once, the metadata and sinks read once."""

from __future__ import annotations

from benchmarks.runner import Cost

HEAD_DIM = 64
BLOCK = 64
# v_mfma_f32_16x16x32_bf16: 16 * 16 * 32 multiply-adds
MFMA_MACS = 16 * 16 * 32


def paged_decode_cost(batch: int, dims: dict) -> Cost:
    hq, hkv = int(dims["query_heads"]), int(dims["kv_heads"])
    window = int(dims.get("sliding_window", 0))
    (length,) = set(int(n) for n in dims["context_lengths"])  # a uniform batch
    keys = min(length, window) if window else length
    kv = batch * keys * hkv * HEAD_DIM * 2 * 2
    qo = 2 * batch * hq * HEAD_DIM * 2
    meta = (batch + 1) * 4 + batch * 4 + batch * -(-keys // BLOCK) * 4 + hq * 4
    macs = 2 * batch * hq * keys * HEAD_DIM  # Q K^T and P V
    return Cost(kv + qo + meta, 2 * macs, -(-macs // MFMA_MACS), min_write_bytes=batch * hq * HEAD_DIM * 2,
                flops_per_s=2.5e15)  # bf16 MFMA dense peak
