"""Decode counters of the paged attention for the issue's table: batches 1, 8, 64, 256 x 1k / 8k / 32k / 128k
keys, full and window layers, TP1 and TP8, against the minimum and the floor (minimum bytes / 8 TB/s).

    ./env.sh python3 -m benchmarks.attention.decode_table [--shapes paged_q64_kv8_d64,paged_q8_kv1_d64]
        [--lengths 1024,8192,32768,131072] [--batches 1,8,64,256] [--windows 0,128] [--fp8] [--json FILE]
    ./env.sh python3 -m benchmarks.attention.decode_table --check 8 --shapes paged_q8_kv1_d64 --lengths 1024
    ./env.sh python3 -m benchmarks.attention.decode_table --check 1 --one-head-from 1024 --shapes paged_q64_kv8_d64 \
        --lengths 1024 --windows 0

How the big batches are derived (the emulator cannot run them whole: 256 x 131072 keys is 64 GiB of bf16
cache at TP1, and hours of emulation). Every sequence of a case has the same length, so its workgroups do
the same work at other addresses; one whole emulator run of ONE sequence gives every batch exactly:
    issued(B) = B * issued(1),  mfma(B) = B * mfma(1),
    distinct(B) = B * (distinct(1) - shared) + shared,
shared = what all sequences read in common: the sinks (Hq x 4 bytes; on the fp8 tier also k_scale and
v_scale) and cu_seqlens_q[0], once per launch (distinct bytes are counted per launch and summed; full layers
have the main and the merge launch, window layers one). Each further sequence adds one cu_seqlens_q dword;
everything else a sequence touches is its own: its cache blocks, q and out rows, block-table row, length,
partial slots.
Full layers at TP1 from 32768 keys run KV head 0 only (emulator workgroup_filter; 8x less emulation): heads
do the same work at other addresses and share only the sequence's metadata (`meta`: in the main launch its
2 cu_seqlens_q dwords, its length and its used block-table entries; in the merge its 2 cu_seqlens_q dwords
and its length), so for one sequence
    issued = Hkv * issued(head 0),  distinct = Hkv * (distinct(head 0) - meta) + meta.
`--check B` runs batch B whole (all heads) and prints it beside the derived figures: they must be equal.
Working workgroups = B x KV heads x splits (the split rule, paged_decode.splits_of); full-layer grids also
hold idle ones (MAX_SPLITS per sequence and KV head).
"""

from __future__ import annotations

import argparse
import json

from types import SimpleNamespace

from benchmarks import runner
from benchmarks.attention.attention_cost import paged_decode_cost

COUNTERS = ("bytes_issued", "bytes_distinct", "mfma")
ONE_HEAD_FROM = {"paged_q64_kv8_d64": 32768}  # full layers from this many keys run KV head 0 only


def measure(bench, batch: int, dims: dict, heads: list[int] | None = None) -> dict:
    """Counters of one whole emulator run (KV heads `heads` only when given) of a uniform batch."""
    from harness import emulator

    entry, inputs = runner._entry_and_inputs(bench, batch, dims=dims)
    entry.warm_up()

    def only(kernel, grid, pointers, read):
        merge = kernel.endswith("_merge")
        return {(x, y, z) for x in range(grid[0]) for y in range(grid[1]) for z in range(grid[2])
                if (x if merge else y) in heads}

    with emulator.options(workgroup_filter=only if heads else None), emulator.launches() as recs:
        entry(**inputs)
    c = {k: 0 for k in COUNTERS}
    for r in recs:
        n = r.counters
        c["bytes_issued"] += n.get("global_load_bytes", 0) + n.get("global_store_bytes", 0)
        c["bytes_distinct"] += n.get("global_load_distinct_bytes", 0) + n.get("global_store_distinct_bytes", 0)
        c["mfma"] += sum(n.get("mfma", {}).values())
    return c


def one_sequence(bench, shape: str, keys: int, window: int, dims: dict, scales: int = 0) -> dict:
    """The counters of one sequence with every KV head, run whole or from KV head 0 (see the docstring)."""
    hkv = int(dims["kv_heads"])
    if window or keys < ONE_HEAD_FROM.get(shape, 1 << 62):
        return measure(bench, 1, dims)
    c = measure(bench, 1, dims, heads=[0])
    meta = (2 + 1 + -(-keys // 64) + 2 + 1) * 4 + scales  # main: cu_seqlens_q[0:2], seq_lens[0], used table
    # entries (and the fp8 tier's k_scale, v_scale); merge: cu_seqlens_q[0:2], seq_lens[0]
    return {"bytes_issued": hkv * c["bytes_issued"], "mfma": hkv * c["mfma"],
            "bytes_distinct": hkv * (c["bytes_distinct"] - meta) + meta}


def derive(c1: dict, batch: int, dims: dict, scales: int = 0) -> dict:
    launches = 1 if int(dims["sliding_window"]) else 2
    # the sinks (and the fp8 tier's k_scale, v_scale); cu_seqlens_q[0] in each launch
    shared = int(dims["query_heads"]) * 4 + scales + 4 * launches
    return {"bytes_issued": batch * c1["bytes_issued"], "mfma": batch * c1["mfma"],
            "bytes_distinct": batch * (c1["bytes_distinct"] - shared) + shared}


def working_workgroups(shape: str, batch: int, keys: int, window: int) -> int:
    from amd_kernels.attention import paged_decode as kd

    kernel = __import__(f"amd_kernels.attention.{shape}.kernel", fromlist=["kernel"])
    splits = 1 if window else kd.splits_of(keys, kernel.MAX_SPLITS, kernel.MIN_SPLIT_BLOCKS)[1]
    return batch * kernel.KV_HEADS * splits


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="paged_q64_kv8_d64,paged_q8_kv1_d64")
    ap.add_argument("--lengths", default="1024,8192,32768,131072")
    ap.add_argument("--batches", default="1,8,64,256")
    ap.add_argument("--windows", default="0,128")
    ap.add_argument("--check", type=int, help="also run this batch whole and print it beside the derived row")
    ap.add_argument("--one-head-from", type=int, help="TP1 full layers from this many keys run KV head 0 only "
                    f"(default {ONE_HEAD_FROM['paged_q64_kv8_d64']}; with --check, tests that derivation)")
    ap.add_argument("--fp8", action="store_true", help="the fp8 e4m3 KV tier (entry paged_attention_fp8)")
    ap.add_argument("--json", help="write the raw and derived figures here")
    args = ap.parse_args(argv)
    runner._setup()
    if args.one_head_from:
        ONE_HEAD_FROM["paged_q64_kv8_d64"] = args.one_head_from
    out = []
    scales = 8 if args.fp8 else 0  # bytes of k_scale and v_scale every workgroup of the fp8 tier reads
    print("shape, layer, keys, batch: issued x min, distinct x min, working workgroups, min bytes, floor us")
    for shape in args.shapes.split(","):
        bench = runner.load_bench(f"attention/{shape}")
        if args.fp8:
            bench = SimpleNamespace(PACKAGE=bench.PACKAGE, OP="paged_attention_fp8", DIMS=bench.DIMS,
                                    cost=lambda m, dims: paged_decode_cost(m, dims, kv_bytes=1))
        for window in [int(w) for w in args.windows.split(",")]:
            for keys in [int(n) for n in args.lengths.split(",")]:
                dims = {**bench.DIMS, "context_lengths": [keys], "sliding_window": window}
                c1 = one_sequence(bench, shape, keys, window, dims, scales)
                out.append({"shape": shape, "window": window, "keys": keys, "one_sequence": c1})
                for batch in [int(b) for b in args.batches.split(",")]:
                    d = derive(c1, batch, dims, scales)
                    cost = bench.cost(batch, dims)
                    floor = runner.floor_us(cost)["floor_bytes_us"]
                    row = {"shape": shape, "window": window, "keys": keys, "batch": batch, **d,
                           "min_bytes": cost.min_bytes, "floor_us": floor,
                           "working_workgroups": working_workgroups(shape, batch, keys, window)}
                    out.append(row)
                    layer = f"window {window}" if window else "full"
                    issued, distinct = d["bytes_issued"] / cost.min_bytes, d["bytes_distinct"] / cost.min_bytes
                    print(f"{shape} {layer:10s} {keys:6d} keys {batch:3d} seq: issued {issued:.3f}x"
                          f"  distinct {distinct:.3f}x"
                          f"  workgroups {row['working_workgroups']}  min {cost.min_bytes}  floor {floor:.2f} us",
                          flush=True)
                if args.check:
                    whole = measure(bench, args.check, dims)
                    d = derive(c1, args.check, dims, scales)
                    print(f"  check batch {args.check} whole: " + ", ".join(
                        f"{k} {whole[k]} (derived {d[k]})" for k in COUNTERS), flush=True)
                    out.append({"shape": shape, "window": window, "keys": keys, "check": args.check,
                                "whole": whole, "derived": d})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
