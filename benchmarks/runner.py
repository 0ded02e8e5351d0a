"""The shared benchmark runner: one kernel package's entry at chosen token counts.

    python3 -m benchmarks.runner gemm/mxfp8_n5120_k2880 [--tokens 1,8,64,256,2048] [--json] [--plot DIR]
    python3 -m benchmarks.runner --all [--tokens ...]        every registered bench, one after the other
    python3 -m benchmarks.runner norm/rmsnorm_h2880 --op rmsnorm_mxfp8    one op of a package with several

A benchmark is `benchmarks/<category>/<shape token>/bench.py` defining
    PACKAGE  "<category>/<shape token>" (the kernel package), OP (reference op name), DIMS (its dims),
    OPS      optional: every op of a package with several entries (the runner measures each; cost takes op=),
    TOKENS   default token counts,
    cost(m)  -> Cost(min_bytes, flops, min_mfma, min_write_bytes, boundary_bytes, link_bytes, flops_per_s):
             what the op cannot do with less at m tokens (min_write_bytes: the part of min_bytes that is
             output, for a reads-only figure; boundary_bytes: the smallest intermediates a staged op must pass
             between its launches, each counted once, for a reads figure against the minimum plus them;
             link_bytes: for a multi-rank op, what one rank must pull from its peers over xGMI),
    ANCHORS  optional: published figures at its shapes, drawn by --plot (benchmarks/plots.py).
A multi-rank package (kernel.toml ranks = 8) runs each case on 8 emulated ranks; each rank projects its own
launches and the row shows the least-waiting rank's (see measure_ranks) and every rank's; counters: rank 0.
Inputs come from the op's builder in references/ (prepared by the package's `prepare` hook when declared).

On a gfx950 GPU: CUDA-graph replay over rotating copies of every input (> 256 MiB in total, more than the
last-level cache, so each call reads its weights from HBM), median microseconds per call over repeats.
On a CPU: the emulator's counters summed over the entry's launches - global bytes loaded + stored (issued
by the lanes, and distinct dwords, the DRAM-like figure) against the minimum, MFMAs against the minimum,
workgroups and waves against 256 CUs, distinct bytes loaded against the minimum's reads (where the bench
gives min_write_bytes; also against those plus boundary_bytes, where given) - and the MI355X floor, max(bytes / 8 TB/s, FLOPs / 5 PFLOP/s). Above
SAMPLE_ABOVE_TOKENS tokens, launches with more than SAMPLE workgroups run a seeded sample whose counters are
scaled to the whole grid (distinct bytes are then not reported: NaN); packages whose grids depend on the data
(kernel.toml workgroups = "tokens") always run whole. Beside the counters it prints the cost model's projected
MI355X time (benchmarks/costmodel.py, calibrated by benchmarks/calibrate.py): labelled "projected", never a
measurement; --launches adds each launch's projection and the term that bounds it. It also times the entry's
eager host cost per call with launches that run no kernel code ("host ... us/call").
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from benchmarks import costmodel

REPO = Path(__file__).resolve().parent.parent
HBM_BYTES_PER_S = 8e12
MXFP8_FLOPS_PER_S = 5e15
CUS = 256
ROTATE_BYTES = 256 << 20
SAMPLE_ABOVE_TOKENS = 128
SAMPLE = 48


@dataclass(frozen=True)
class Cost:
    min_bytes: int
    flops: int
    min_mfma: int = 0
    min_write_bytes: int = 0
    boundary_bytes: int = 0
    link_bytes: int = 0  # multi-rank ops: bytes one rank must pull from its peers (over 7 xGMI links)
    flops_per_s: float = MXFP8_FLOPS_PER_S  # the dense peak of the op's math (bf16: 2.5 PFLOP/s)


def floor_us(cost: Cost) -> dict:
    terms = {"memory": cost.min_bytes / HBM_BYTES_PER_S * 1e6, "compute": cost.flops / cost.flops_per_s * 1e6,
             "xgmi": cost.link_bytes / (costmodel.XGMI_LINKS * costmodel.XGMI_BYTES_PER_S) * 1e6}
    bound = max(terms, key=terms.get)
    return {"floor_us": terms[bound], "floor_bytes_us": terms["memory"], "floor_flops_us": terms["compute"],
            "floor_link_us": terms["xgmi"], "bound": bound}


def _setup():
    sys.path.insert(0, str(REPO))
    from harness import importer, device

    importer.expose_amd_kernels()
    return device.setup()


def ops_of(bench) -> tuple:
    """The ops a bench measures: its OPS (a package with several entries), else its OP."""
    return tuple(getattr(bench, "OPS", None) or (bench.OP,))


def _entry_and_inputs(bench, tokens: int, seed: int = 0, dims: dict | None = None, op: str | None = None):
    from harness import discovery
    from references import OPS

    op = op or bench.OP
    pkg = discovery.discover()[bench.PACKAGE]
    name = pkg.entry_for_op(op)
    entry = pkg.import_entries()[name]
    inputs = pkg.entry_inputs(name, OPS[op].build_inputs(tokens, dims or bench.DIMS, seed))
    return entry, inputs


def measure_emulator(bench, tokens: int, dims: dict | None = None, op: str | None = None) -> dict:
    from harness import emulator

    from harness import discovery

    op = op or bench.OP
    if discovery.discover()[bench.PACKAGE].ranks > 1:
        return measure_ranks(bench, tokens, dims, op)
    entry, inputs = _entry_and_inputs(bench, tokens, dims=dims, op=op)
    entry.warm_up()
    # Big token counts run a seeded sample of each launch's workgroups (launches with fewer run whole), where
    # every workgroup does the same work. Data-dependent grids (kernel.toml workgroups = "tokens", e.g. MoE
    # tiles past the sorted count exit at once) cannot be scaled from a sample: they run whole.
    scalable = discovery.discover()[bench.PACKAGE].workgroups in ("rows", "tiles")
    opts = dict(workgroup_sample=SAMPLE, sample_seed=0) if scalable and tokens > SAMPLE_ABOVE_TOKENS else {}
    with emulator.options(**opts), emulator.launches() as recs:
        entry(**inputs)
    totals = {"global_load_bytes": 0, "global_store_bytes": 0, "global_load_distinct_bytes": 0,
              "global_store_distinct_bytes": 0, "mfma": 0, "wave_instructions": 0, "smem_bytes": 0}
    launches = []
    model_in = [costmodel.launch_from_record(r) for r in recs]
    for r in recs:
        c = r.counters
        ran = len(r.workgroups_executed) if r.workgroups_executed is not None else _wgs(r.grid)
        scale = _wgs(r.grid) / max(ran, 1)
        for k in ("global_load_bytes", "global_store_bytes", "wave_instructions", "smem_bytes"):
            totals[k] += c.get(k, 0) * scale
        for k in ("global_load_distinct_bytes", "global_store_distinct_bytes"):
            totals[k] += c.get(k, 0) if scale == 1 else float("nan")
        totals["mfma"] += sum(c.get("mfma", {}).values()) * scale
        launches.append({"kernel": r.kernel_name, "grid": list(r.grid), "workgroups": _wgs(r.grid),
                         "waves_per_workgroup": -(-_wgs(r.block) // 64), "sampled": scale != 1,
                         "load_distinct": c.get("global_load_distinct_bytes", 0) if scale == 1 else None,
                         "store_distinct": c.get("global_store_distinct_bytes", 0) if scale == 1 else None,
                         "mfma": int(sum(c.get("mfma", {}).values()) * scale)})
    cost = _cost(bench, tokens, dims, op)
    projected = _project(model_in, cost)
    for launch, proj in zip(launches, projected["launches"]):
        launch["projected_us"], launch["projected_bound"] = proj["us"], proj["bound"]
    issued = totals["global_load_bytes"] + totals["global_store_bytes"]
    distinct = totals["global_load_distinct_bytes"] + totals["global_store_distinct_bytes"]
    out = {
        "op": op,
        "tokens": tokens,
        "launches": launches,
        "workgroups_main": max(l["workgroups"] for l in launches),
        "waves_main": max(l["workgroups"] * l["waves_per_workgroup"] for l in launches),
        "bytes_issued": int(issued),
        "bytes_distinct": distinct if distinct != distinct else int(distinct),
        "min_bytes": cost.min_bytes,
        "flops": cost.flops,
        "bytes_issued_x_min": issued / cost.min_bytes,
        "bytes_distinct_x_min": distinct / cost.min_bytes,
        "loads_distinct_x_min_reads": (totals["global_load_distinct_bytes"] / (cost.min_bytes - cost.min_write_bytes)
                                       if cost.min_write_bytes else None),
        "loads_distinct_x_staged_reads": (totals["global_load_distinct_bytes"]
                                          / (cost.min_bytes - cost.min_write_bytes + cost.boundary_bytes)
                                          if cost.min_write_bytes and cost.boundary_bytes else None),
        "mfma": int(totals["mfma"]),
        "min_mfma": cost.min_mfma,
        "mfma_x_min": (totals["mfma"] / cost.min_mfma) if cost.min_mfma else None,
        "wave_instructions": int(totals["wave_instructions"]),
        "projected_us": projected["us"],
        "model": [{"launches": model_in, "dram_bytes": projected["dram_bytes"], "link_bytes": [0] * len(model_in)}],
        # scalar (SMEM) loads: kernel arguments, and wave-uniform data some kernels read this way
        "smem_bytes": int(totals["smem_bytes"]),
    }
    out.update(floor_us(cost))
    out["host_us_per_call"] = host_us_per_call(entry, inputs)
    return out


def host_us_per_call(entry, inputs: dict, calls: int = 200, batches: int = 7) -> float | None:
    """Eager host cost of one call (argument checks, tier choice, the compiled call, kernarg packing and the
    HIP substitute's launch path) with launches that run no kernel code: the fastest batch's mean, in us of
    this process's CPU time (time.process_time: on this shared machine wall time also counts the waits for
    a core; on an idle machine the two agree). None when the entry cannot run without its kernels' results
    (a host read of device data failing)."""
    import time

    from harness import emulator

    try:
        with emulator.options(execute=False):
            entry(**inputs)
            means = []
            for _ in range(batches):
                start = time.process_time()
                for _ in range(calls):
                    entry(**inputs)
                means.append((time.process_time() - start) / calls * 1e6)
    except Exception:  # noqa: BLE001 - reported as unmeasured, not fatal
        return None
    return min(means)


def _project(model_in: list[dict], cost: Cost) -> dict:
    """The cost model's projected MI355X time (benchmarks/costmodel.py). A sampled launch has no distinct
    byte count: the op's minimum bytes not accounted for by the whole launches are shared among the sampled
    ones in proportion to the bytes they issue."""
    whole = sum(L["counters"].get("global_load_distinct_bytes", 0) + L["counters"].get("global_store_distinct_bytes", 0)
                for L in model_in if not L["sampled"])
    issued = [(L["counters"].get("global_load_bytes", 0) + L["counters"].get("global_store_bytes", 0))
              * L["workgroups"] / max(1, L["ran"]) for L in model_in]
    sampled_issued = sum(b for b, L in zip(issued, model_in) if L["sampled"])
    rest = max(0, cost.min_bytes - whole)
    dram = [None if not L["sampled"] else rest * b / max(1, sampled_issued) for b, L in zip(issued, model_in)]
    out = costmodel.project_launches(model_in, dram)
    out["dram_bytes"] = dram
    return out


def reproject(row: dict, fit=None) -> dict:
    """A row of `--json` output projected again (e.g. after a new calibration) from the model inputs it keeps
    ("model": per rank, each launch's counters and code-object resources, its DRAM and link bytes)."""
    per_rank = [costmodel.project_launches(m["launches"], m["dram_bytes"], fit, m["link_bytes"]) for m in row["model"]]
    least = min(per_rank, key=lambda p: p["us"])  # multi-rank: the least-waiting rank (see measure_ranks)
    for launch, proj in zip(row["launches"], per_rank[0]["launches"]):
        launch["projected_us"], launch["projected_bound"] = proj["us"], proj["bound"]
    row["projected_us"] = least["us"]
    if len(per_rank) > 1:
        row["projected_us_per_rank"] = [p["us"] for p in per_rank]
    return row


def _cost(bench, tokens: int, dims: dict | None, op: str | None = None) -> Cost:
    """bench.cost(m), or bench.cost(m, dims) when the run overrides the bench's DIMS (--dims); benches with
    several OPS take op= as well."""
    kw = {"op": op or bench.OP} if getattr(bench, "OPS", None) else {}
    return bench.cost(tokens, dims, **kw) if dims else bench.cost(tokens, **kw)


def measure_ranks(bench, tokens: int, dims: dict | None, op: str) -> dict:
    """A multi-rank package (kernel.toml ranks = n): each rank runs the entry once in its own emulated process
    (harness/emulator/ranks.py) and projects its own launches; the row reports rank 0's counters, every
    rank's projection and, as the op's, the smallest: the emulated ranks start at different times and an
    early rank's flag polling (counted as instructions) measures the emulator's scheduling, not the chip's;
    the rank that arrives last waits least, the case of ranks arriving together (a graph replay)."""
    from harness import discovery
    from harness.emulator import ranks

    world = discovery.discover()[bench.PACKAGE].ranks
    merged = dims or bench.DIMS
    per_rank = ranks.run(_rank_measure, world=world, args=(bench.__name__, op, tokens, merged))
    cost = _cost(bench, tokens, dims, op)
    first = per_rank[0]
    out = {"op": op, "tokens": tokens, "ranks": world, "launches": first["launches"],
           "workgroups_main": max(l["workgroups"] for l in first["launches"]),
           "waves_main": max(l["workgroups"] * l["waves_per_workgroup"] for l in first["launches"]),
           "bytes_issued": first["bytes_issued"], "bytes_distinct": first["bytes_distinct"],
           "min_bytes": cost.min_bytes, "flops": cost.flops,
           "bytes_issued_x_min": first["bytes_issued"] / cost.min_bytes,
           "bytes_distinct_x_min": first["bytes_distinct"] / cost.min_bytes,
           "loads_distinct_x_min_reads": None, "loads_distinct_x_staged_reads": None,
           "mfma": 0, "min_mfma": 0, "mfma_x_min": None, "wave_instructions": first["wave_instructions"],
           "smem_bytes": first["smem_bytes"],
           "projected_us": min(r["projected_us"] for r in per_rank),
           "projected_us_per_rank": [r["projected_us"] for r in per_rank],
           "model": [r["model"] for r in per_rank],
           "host_us_per_call": max((r["host_us_per_call"] for r in per_rank if r["host_us_per_call"] is not None),
                                   default=None)}
    out.update(floor_us(cost))
    return out


def _rank_measure(rank: int, world: int, bench_module: str, op: str, tokens: int, dims: dict) -> dict:
    """In rank process `rank`: one call of the entry, its counters and its projection (the link bytes are the
    op's per-rank minimum from the bench's cost); then the host cost per call."""
    import torch

    from amd_kernels.comm import communicator
    from harness import discovery, emulator
    from references import OPS

    bench = importlib.import_module(bench_module)
    pkg = discovery.discover()[bench.PACKAGE]
    entry = pkg.import_entries()[pkg.entry_for_op(op)]
    communicator.create(max_tokens=max(tokens, 1), hidden=int(dims["hidden"]))
    entry.warm_up()
    inputs = OPS[op].build_inputs(tokens, dims, 0)
    mine = {k: (v[rank].contiguous() if k == "x" and isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
    with emulator.launches() as recs:
        entry(**mine)
    cost = _cost(bench, tokens, dims, op)
    model_in = [costmodel.launch_from_record(r) for r in recs]
    links = [cost.link_bytes if i == 0 else 0 for i in range(len(recs))]  # as project_records charges them
    projected = costmodel.project_launches(model_in, link_bytes=links)
    launches, issued, distinct, waves_instr, smem = [], 0, 0, 0, 0
    for r, proj in zip(recs, projected["launches"]):
        c = r.counters
        issued += c.get("global_load_bytes", 0) + c.get("global_store_bytes", 0)
        distinct += c.get("global_load_distinct_bytes", 0) + c.get("global_store_distinct_bytes", 0)
        waves_instr += c.get("wave_instructions", 0)
        smem += c.get("smem_bytes", 0)
        launches.append({"kernel": r.kernel_name, "grid": list(r.grid), "workgroups": _wgs(r.grid),
                         "waves_per_workgroup": -(-_wgs(r.block) // 64), "sampled": False,
                         "load_distinct": c.get("global_load_distinct_bytes", 0),
                         "store_distinct": c.get("global_store_distinct_bytes", 0),
                         "mfma": int(sum(c.get("mfma", {}).values())),
                         "projected_us": proj["us"], "projected_bound": proj["bound"]})
    return {"launches": launches, "bytes_issued": int(issued), "bytes_distinct": int(distinct),
            "model": {"launches": model_in, "dram_bytes": None, "link_bytes": links},
            "wave_instructions": int(waves_instr), "smem_bytes": int(smem), "projected_us": projected["us"],
            "host_us_per_call": host_us_per_call(entry, mine)}


def _wgs(grid) -> int:
    return int(grid[0]) * int(grid[1]) * int(grid[2])


def measure_gpu(bench, tokens: int, repeats: int = 20, calls_per_graph: int | None = None,
                dims: dict | None = None, op: str | None = None) -> dict:
    import torch

    entry, inputs = _entry_and_inputs(bench, tokens, dims=dims, op=op)
    inputs = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    entry.warm_up()
    per_copy = sum(v.numel() * v.element_size() for v in inputs.values() if isinstance(v, torch.Tensor))
    copies = max(2, -(-ROTATE_BYTES // max(per_copy, 1)) + 1)
    sets = [inputs] + [{k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
                       for _ in range(copies - 1)]
    n = calls_per_graph or copies
    for s in sets[:2]:
        entry(**s)
    torch.cuda.synchronize()
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        for i in range(n):
            entry(**sets[i % copies])
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / n)
    out = {"op": op or bench.OP, "tokens": tokens, "median_us": statistics.median(times), "copies": copies,
           "calls_per_graph": n}
    out.update(floor_us(_cost(bench, tokens, dims, op)))
    out["x_floor"] = out["median_us"] / out["floor_us"]
    return out


def load_bench(path: str):
    mod = "benchmarks." + path.strip("/").replace("/", ".") + ".bench"
    return importlib.import_module(mod)


def run(path: str, tokens: list[int] | None = None, dims: dict | None = None, ops: list[str] | None = None) -> list[dict]:
    """`dims`: keys that override the bench's DIMS (its cost then gets them too); `ops`: which of the
    bench's ops (default every one)."""
    dev = _setup()
    bench = load_bench(path)
    counts = tokens or list(bench.TOKENS)
    measure = measure_emulator if dev.emulated else measure_gpu
    merged = {**bench.DIMS, **dims} if dims else None
    return [measure(bench, t, dims=merged, op=op) for op in (ops or ops_of(bench)) for t in counts]


def all_benches() -> list[str]:
    """Every registered bench, "<category>/<shape token>" (a folder under benchmarks/ with a bench.py)."""
    here = Path(__file__).resolve().parent
    return sorted(p.parent.relative_to(here).as_posix() for p in here.glob("*/*/bench.py"))


def _fmt(row: dict) -> str:
    if "median_us" in row:
        return (f"M={row['tokens']:5d}  {row['median_us']:8.2f} us  floor {row['floor_us']:7.2f} us "
                f"({row['bound']})  x{row['x_floor']:.2f}")
    mfma = f"{row['mfma']}/{row['min_mfma']} = {row['mfma_x_min']:.3f}x" if row["min_mfma"] else "-"
    dist = row["bytes_distinct_x_min"]
    dist = "  sampled" if dist != dist else f"{dist:8.3f}x"  # NaN: a sampled run has no distinct count
    reads = row.get("loads_distinct_x_min_reads")
    staged = row.get("loads_distinct_x_staged_reads")
    if reads is not None and reads == reads:
        dist += f"  (loads {reads:.3f}x min reads" + (f", {staged:.3f}x with the stage boundaries)"
                                                       if staged is not None else ")")
    ranks = ""
    if row.get("projected_us_per_rank"):
        ranks = (f" (least-waiting of {row['ranks']} ranks, each projected from its own counters: "
                 + " ".join(f"{u:.2f}" for u in row["projected_us_per_rank"]) + "; counters: rank 0)")
    return (f"M={row['tokens']:5d}  bytes issued {row['bytes_issued']:>11d} = {row['bytes_issued_x_min']:6.3f}x min"
            f"  distinct {dist}  (min {row['min_bytes']})  mfma {mfma}  workgroups {row['workgroups_main']}"
            f"  waves {row['waves_main']}" + (f"  smem {row['smem_bytes']} B" if row.get("smem_bytes") else "")
            + f"  floor {row['floor_us']:.3f} us ({row['bound']})  projected {row['projected_us']:.2f} us" + ranks
            + (f"  host {row['host_us_per_call']:.1f} us/call" if row.get("host_us_per_call") is not None else ""))


def print_rows(name: str, rows: list[dict], launches: bool = False) -> None:
    print(name)
    op = None
    for row in rows:
        if row.get("op") != op:
            op = row.get("op")
            print(f" {op}")
        print("  " + _fmt(row))
        for launch in row.get("launches", []) if launches else []:
            dist = ("sampled" if launch["sampled"] else
                    f"loads {launch['load_distinct']}  stores {launch['store_distinct']}")
            print(f"      {launch['kernel']:48s} grid {launch['grid']}  {dist}  mfma {launch['mfma']}"
                  f"  projected {launch['projected_us']:.2f} us ({launch['projected_bound']})")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bench", nargs="?", help="<category>/<shape token>, a folder under benchmarks/ (or --all)")
    ap.add_argument("--all", action="store_true", help="every registered bench, one after the other")
    ap.add_argument("--tokens", help="comma-separated token counts (default: the benchmark's)")
    ap.add_argument("--op", help="one op of a bench with several (default: all of its OPS)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--dims", help="JSON object overriding keys of the bench's DIMS (e.g. attention's context_lengths)")
    ap.add_argument("--launches", action="store_true", help="also print each launch's distinct bytes and MFMAs")
    ap.add_argument("--plot", metavar="DIR", help="also write PNG figures of the projections to DIR "
                    "(benchmarks/plots.py; needs matplotlib: pip install 'amd_kernels[plot]')")
    args = ap.parse_args(argv)
    if bool(args.bench) == args.all:
        ap.error("name one bench, or pass --all")
    if args.plot:
        from benchmarks import plots

        plots.require_matplotlib()  # fail before the (slow) measurements, naming the extra
    tokens = [int(t) for t in args.tokens.split(",")] if args.tokens else None
    dims = json.loads(args.dims) if args.dims else None
    results = {}
    for name in (all_benches() if args.all else [args.bench]):
        rows = run(name, tokens, dims, [args.op] if args.op else None)
        results[name] = rows
        if not args.json:
            print_rows(name, rows, args.launches)
            sys.stdout.flush()
    if args.json:
        print(json.dumps(results if args.all else results[args.bench], indent=1))
    if args.plot:
        for path in plots.write_all(results, args.plot):
            print(f"wrote {path}")


if __name__ == "__main__":
    main()
