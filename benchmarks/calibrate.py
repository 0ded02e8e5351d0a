"""Calibrate the cost model (benchmarks/costmodel.py) on published MI355X timings of FlyDSL kernels.

    FLYDSL_SRC=/path/to/FlyDSL ./env.sh python3 -m benchmarks.calibrate [--emulate] [--write] [--only NAME]

Points (benchmarks/calibration_points.csv, each with its source): kernels from ROCm/FlyDSL that AITER's tuned
tables time on MI355X (gfx950, 256 CUs), at the tabled shape and tile. --emulate runs the missing points
through our emulator from a FlyDSL checkout (FLYDSL_SRC or --flydsl; nothing of it is committed) and caches
each point's per-launch counters in .cache/costmodel/<point>.json, so the fit reruns without emulating. Big
grids run a seeded sample of workgroups (counters are per workgroup, scaled to the grid by the model).
The fit (log-ratio least squares, coordinate search) uses every point but one in three; the held-out third
gives the error quoted in benchmarks/README.md. --write stores the fitted constants in
benchmarks/costmodel_fit.py, which costmodel.py loads.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import statistics
import sys
import time
from dataclasses import asdict, fields
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
POINTS = REPO / "benchmarks" / "calibration_points.csv"
CACHE = REPO / ".cache" / "costmodel"
SAMPLE_ABOVE = 128     # workgroups; bigger grids run a sample
SAMPLE = 12


def load_points() -> list[dict]:
    with open(POINTS) as f:
        return [r for r in csv.DictReader(f)]


def held_out(i: int) -> bool:
    return i % 3 == 1


def _fp8_gemm(p: dict, flydsl: Path) -> dict:
    import torch
    from harness import emulator
    from benchmarks import costmodel

    if str(flydsl) not in sys.path:
        sys.path.insert(0, str(flydsl))
    from kernels.gemm.preshuffle_gemm import compile_preshuffle_gemm

    M, N, K = int(p["M"]), int(p["N"]), int(p["K"])
    fn = compile_preshuffle_gemm(N=N, K=K, tile_m=int(p["tile_m"]), tile_n=int(p["tile_n"]), tile_k=int(p["tile_k"]),
                                 in_dtype="fp8", out_dtype="bf16", use_async_copy=bool(int(p["async_copy"])),
                                 waves_per_eu=int(p["waves_per_eu"]) or None, xcd_swizzle=int(p["xcd_swizzle"]),
                                 lds_stage=int(p["lds_stage"]))
    g = torch.Generator().manual_seed(0)
    # Counters do not depend on the values (no data-dependent control flow): small random codes suffice.
    a = torch.randint(0, 64, (M * K,), dtype=torch.uint8, generator=g).view(torch.int8)
    b = torch.randint(0, 64, (N * K,), dtype=torch.uint8, generator=g).view(torch.int8)
    c = torch.zeros(M * N, dtype=torch.bfloat16)
    sa, sb, bias = torch.ones(M), torch.ones(N), torch.empty(0, dtype=torch.bfloat16)
    wgs = -(-M // int(p["tile_m"])) * (N // int(p["tile_n"]))
    opts = dict(workgroup_sample=SAMPLE, sample_seed=0) if wgs > SAMPLE_ABOVE else {}
    fn(c, a, b, sa, sb, bias, M, N, None)  # compile + load outside the recorded run
    with emulator.options(**opts), emulator.launches() as recs:
        fn(c, a, b, sa, sb, bias, M, N, None)
    launches = [costmodel.launch_from_record(r) for r in recs]
    min_bytes = M * K + N * K + 2 * M * N + 4 * (M + N)
    return {"launches": launches, "dram_bytes": [min_bytes] if any(L["sampled"] for L in launches) else None}


def _flash_attn(p: dict, flydsl: Path) -> dict:
    """FlyDSL's gfx950 dual-wave flash attention forward (BSHD bf16), point fields: M=batch, N=seq, K=heads,
    tile_m=kv heads, tile_n=head dim, tile_k=causal (1/0)."""
    import torch
    from harness import emulator
    from benchmarks import costmodel

    if str(flydsl) not in sys.path:
        sys.path.insert(0, str(flydsl))
    from kernels.attention.flash_attn_gfx950 import build_flash_attn_dualwave_swp_module

    B, S, H, HKV, D, causal = (int(p[k]) for k in ("M", "N", "K", "tile_m", "tile_n", "tile_k"))
    exe = build_flash_attn_dualwave_swp_module(H, D, causal=bool(causal), dtype_str="bf16", num_kv_heads=HKV)
    g = torch.Generator().manual_seed(0)
    q = (torch.rand(B, S, H, D, generator=g) * 2 - 1).bfloat16()
    k = (torch.rand(B, S, HKV, D, generator=g) * 2 - 1).bfloat16()
    v = (torch.rand(B, S, HKV, D, generator=g) * 2 - 1).bfloat16()
    o = torch.zeros_like(q)
    with emulator.options(workgroup_sample=SAMPLE, sample_seed=0), emulator.launches() as recs:
        exe(q, k, v, o, B, S)
    launches = [costmodel.launch_from_record(r) for r in recs]
    return {"launches": launches, "dram_bytes": [2 * B * S * D * (2 * H + 2 * HKV)]}


RUNNERS = {"fp8_preshuffle_gemm": _fp8_gemm, "flash_attn_gfx950": _flash_attn}


def emulate(points, flydsl: Path, only=None) -> None:
    sys.path.insert(0, str(REPO))
    from harness import emulator

    emulator.install()
    CACHE.mkdir(parents=True, exist_ok=True)
    for p in points:
        out = CACHE / f"{p['point']}.json"
        if out.exists() or (only and p["point"] not in only):
            continue
        t0 = time.time()
        res = RUNNERS[p["kind"]](p, flydsl)
        res["emulated_seconds"] = time.time() - t0
        out.write_text(json.dumps(res))
        print(f"emulated {p['point']} in {res['emulated_seconds']:.1f} s", flush=True)


def load_cached(points) -> list[tuple[dict, dict]]:
    out = []
    for p in points:
        f = CACHE / f"{p['point']}.json"
        if f.exists():
            out.append((p, json.loads(f.read_text())))
    return out


def project(res: dict, fit) -> dict:
    from benchmarks import costmodel

    return costmodel.project_launches(res["launches"], res.get("dram_bytes"), fit)


def _loss(pairs, fit) -> float:
    return sum(math.log(project(r, fit)["us"] / float(p["published_us"])) ** 2 for p, r in pairs)


# Search ranges of the fitted constants (physical bounds: a launch costs 0-10 us, an exposed wait 0-2000 cycles).
BOUNDS = {"launch_us": (0.0, 10.0), "wait_cycles": (0.0, 2000.0), "hbm_efficiency": (0.4, 1.0), "overlap": (0.0, 1.0)}


def fit_constants(pairs):
    from benchmarks.costmodel import Fitted

    fit = Fitted()
    best = _loss(pairs, fit)
    for sweep in range(6):
        for name, (lo, hi) in BOUNDS.items():
            for _ in range(2):
                cur = getattr(fit, name)
                span = (hi - lo) / (3 ** sweep)
                for k in range(-8, 9):
                    v = min(hi, max(lo, cur + span * k / 8))
                    trial = Fitted(**{**asdict(fit), name: v})
                    loss = _loss(pairs, trial)
                    if loss < best:
                        best, fit = loss, trial
    return fit, best


def table(rows, fit) -> tuple[str, dict]:
    lines = ["| point | published us | projected us | ratio | bound | set |", "|---|---:|---:|---:|---|---|"]
    ratios = {"fit": [], "held out": []}
    for i, p, r in rows:
        pr = project(r, fit)
        ratio = pr["us"] / float(p["published_us"])
        s = "held out" if held_out(i) else "fit"
        ratios[s].append(ratio)
        bound = max(pr["launches"], key=lambda o: o["us"])["bound"]
        lines.append(f"| {p['point']} | {float(p['published_us']):.2f} | {pr['us']:.2f} | {ratio:.2f} | {bound} | {s} |")
    summary = {}
    for s, rs in ratios.items():
        if rs:
            errs = [abs(x - 1) for x in rs]
            summary[s] = {"n": len(rs), "median_abs_error": statistics.median(errs),
                          "worst_ratio": max(rs, key=lambda x: abs(math.log(x)))}
    return "\n".join(lines), summary


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--flydsl", default=os.environ.get("FLYDSL_SRC", "/tmp/fly"), help="FlyDSL source checkout")
    ap.add_argument("--emulate", action="store_true", help="emulate points missing from the cache")
    ap.add_argument("--only", help="comma-separated point names to emulate")
    ap.add_argument("--write", action="store_true", help="write the fitted constants to benchmarks/costmodel_fit.py")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(REPO))
    points = load_points()
    if args.emulate:
        emulate(points, Path(args.flydsl), set(args.only.split(",")) if args.only else None)
    idx = {p["point"]: i for i, p in enumerate(points)}
    cached = load_cached(points)
    if not cached:
        sys.exit("no cached points: run with --emulate and a FlyDSL checkout")
    train = [(p, r) for p, r in cached if not held_out(idx[p["point"]])]
    fit, loss = fit_constants(train)
    text, summary = table([(idx[p["point"]], p, r) for p, r in cached], fit)
    print(text)
    print()
    print("fitted:", json.dumps(asdict(fit)))
    for s, d in summary.items():
        print(f"{s}: {d['n']} points, median |projected/published - 1| = {d['median_abs_error']:.1%}, "
              f"worst ratio {d['worst_ratio']:.2f}")
    if args.write:
        (REPO / "benchmarks" / "costmodel_fit.py").write_text(
            '"""Constants fitted by `python -m benchmarks.calibrate --write` (do not edit by hand)."""\n\n'
            f"FIT = {json.dumps({k: round(v, 4) for k, v in asdict(fit).items()})}\n")


if __name__ == "__main__":
    main()
