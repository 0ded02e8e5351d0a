"""Counters of the paged attention's prefill tier at sizes too big to emulate whole (1 x 8192 full takes
~16k workgroup-blocks): a few Q tiles of each case run in the emulator (sequence 0's first, second and
last tile, KV head 0), their MFMAs must equal the host twin's count (the kernel's block ranges and
per-wave skips); the whole case is then totalled with that twin and set against the
minimum (the causal / window triangle, benchmarks/attention/attention_cost.py) and the floor (FLOPs at
2.5 PFLOP/s). A whole run of a small case (benchmarks.runner) checks the extrapolation.

    AMD_KERNELS_SANITIZE=0 ./env.sh python3 -m benchmarks.attention.prefill_counters 8   # TP size 1 or 8
"""
import importlib
import json
import sys
import time

from harness import device
device.setup()
from harness import emulator
from references import attention as ra
from benchmarks.attention.attention_cost import BF16_FLOPS_PER_S, paged_prefill_cost
from amd_kernels.attention import paged_prefill as kp


def blocks_of(tile, q_len, L, window):
    """(first block, unmasked first, unmasked end, end block) of a Q tile: the kernel's _block_ranges."""
    tok0 = tile * kp.TILE_TOKENS
    pf = L - q_len + tok0
    pl = L - q_len + min(q_len, tok0 + kp.TILE_TOKENS) - 1
    hi = pl // 64 + 1
    if window:
        lo = max(pf - (window - 1), 0) // 64
        mid_lo = min(max(-(-max(pl - (window - 1), 0) // 64), lo), hi)
    else:
        lo = mid_lo = 0
    mid_hi = min(max((pf + 1) // 64, mid_lo), hi)
    return lo, mid_lo, mid_hi, hi


def mfma_of(tile, q_len, L, window):
    """MFMAs of one Q tile and KV head: every wave's Q K^T of the 16-key tiles and P V of the 32-key halves
    it keeps in edge blocks, all of them in the others (the kernel's rule)."""
    lo, mid_lo, mid_hi, hi = blocks_of(tile, q_len, L, window)
    per_wave = 4 * 2 * kp.COLS + 2 * 4 * kp.COLS
    n = 0
    for blk in range(lo, hi):
        if mid_lo <= blk < mid_hi:
            n += kp.WAVES * per_wave
            continue
        for w in range(kp.WAVES):
            p0 = L - q_len + tile * kp.TILE_TOKENS + w * kp.WAVE_TOKENS
            p1 = p0 + kp.WAVE_TOKENS - 1
            need = [blk * 64 + 16 * t <= p1 and (not window or blk * 64 + 16 * t + 15 > p0 - window)
                    for t in range(4)]
            n += sum(need) * 2 * kp.COLS + sum(need[2 * h] or need[2 * h + 1] for h in range(2)) * 4 * kp.COLS
    return n


def case(tp, S, tokens, prefix, window, sample_tiles):
    hq, hkv = ra.HEADS[tp]
    pkg = importlib.import_module(f"amd_kernels.attention.paged_q{hq}_kv{hkv}_d64")
    dims = {"query_heads": hq, "kv_heads": hkv, "head_dim": 64, "sliding_window": window, "prefill_sequences": S,
            "prefill_uniform": True, "cached_prefix": [prefix], "decode_sequences": 0}
    inp = ra.build_paged_attention_inputs(tokens, dims, 0)
    q_lens = (inp["cu_seqlens_q"][1:] - inp["cu_seqlens_q"][:-1]).tolist()
    lens = inp["seq_lens"].tolist()
    pkg.paged_attention.warm_up()
    # sampled workgroups: tiles `sample_tiles` (indices into the sequence's tiles) of sequence 0, KV head 0
    nt0 = kp.tiles_of(q_lens[0])
    tiles = sorted({min(t, nt0 - 1) for t in sample_tiles})

    def chooser(kernel, grid, pointers, read):
        if kernel.startswith("paged_prefill"):
            return {(nt0 - 1 - t, 0, 0) for t in tiles}
        return set()

    with emulator.options(workgroup_filter=chooser), emulator.launches() as recs:
        pkg.paged_attention(**inp)
    rec = [r for r in recs if r.kernel_name.startswith("paged_prefill")][0]
    c = rec.counters
    mfma = sum(c.get("mfma", {}).values())
    nblocks = lambda t, q, L: blocks_of(t, q, L, window)[3] - blocks_of(t, q, L, window)[0]  # noqa: E731
    blk_sampled = sum(nblocks(t, q_lens[0], lens[0]) for t in tiles)
    predicted = sum(mfma_of(t, q_lens[0], lens[0], window) for t in tiles)
    if predicted != mfma:
        raise AssertionError(f"sampled tiles ran {mfma} MFMAs, the host twin says {predicted}")
    kv_loaded = c.get("global_load_bytes", 0)
    # whole case from the per-tile counts
    blk_total = sum(nblocks(t, q, L) for q, L in zip(q_lens, lens) for t in range(kp.tiles_of(q))) * hkv
    cost = paged_prefill_cost(tokens, dims)
    mfma_total = sum(mfma_of(t, q, L, window) for q, L in zip(q_lens, lens) for t in range(kp.tiles_of(q))) * hkv
    kv_bytes = blk_total * 64 * 128 * 2  # K and V of each block once per Q tile
    distinct_kv = sum(min(L, q + window - 1) if window else L for q, L in zip(q_lens, lens)) * hkv * 128 * 2
    return {"tp": tp, "seqs": S, "tokens": tokens, "prefix": prefix, "window": window,
            "sampled_tiles": tiles, "sampled_blocks": blk_sampled, "mfma_sampled": mfma,
            "mfma_predicted_sampled": predicted, "load_bytes_sampled": kv_loaded,
            "load_bytes_per_block": kv_loaded / blk_sampled,
            "mfma_total": mfma_total, "mfma_min": cost.min_mfma, "mfma_vs_min": mfma_total / cost.min_mfma,
            "kv_bytes_once_per_tile": kv_bytes, "kv_distinct_min": distinct_kv,
            "kv_tile_reads_vs_distinct": kv_bytes / distinct_kv,
            "flops_min": cost.flops, "floor_us": cost.flops / BF16_FLOPS_PER_S * 1e6}


if __name__ == "__main__":
    tp = int(sys.argv[1])
    out = []
    for S, tokens in ((1, 8192), (4, 8192), (16, 4096)):
        for window in (0, 128):
            for prefix in (0, 1000):
                t0 = time.time()
                r = case(tp, S, tokens, prefix, window, [0, 1, 10_000])
                r["seconds"] = round(time.time() - t0, 1)
                print(json.dumps(r), flush=True)
