"""Calibrate the cost model (benchmarks/costmodel.py) on published MI355X timings of FlyDSL kernels.

    FLYDSL_SRC=/path/to/FlyDSL AITER_SRC=/path/to/aiter ./env.sh python3 -m benchmarks.calibrate [--emulate] [--write]

Points (benchmarks/calibration_points.csv, each with its source): FlyDSL kernels that AITER's tuned tables or
FlyDSL's PRs time on MI355X (gfx950, 256 CUs), at the published shape and tile. --emulate runs the missing
points through our emulator from a FlyDSL checkout (FLYDSL_SRC or --flydsl) and, for the MoE kernels that live
in AITER, an AITER checkout (AITER_SRC or --aiter); nothing of either is committed. It caches
each point's per-launch counters in .cache/costmodel/<point>.json, so the fit reruns without emulating. Big
grids run a seeded sample of workgroups (counters are per workgroup, scaled to the grid by the model).
The fit (log-ratio least squares, coordinate search) leaves out whole kernel families (HELD_OUT_FAMILIES: the
MoE down GEMM and the flash attention) and one row in three of the others; both held-out sets' errors are
quoted in benchmarks/README.md. --write stores the fitted constants in
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
SAMPLE_HEAVY = 4       # for GEMM workgroups of more than HEAVY_MACS multiply-adds (about a minute each here)
HEAVY_MACS = 1 << 26


def _kv(text: str) -> dict:
    out = {}
    for item in filter(None, text.split(";")):
        k, v = item.split("=")
        out[k] = int(v) if v.lstrip("-").isdigit() else v
    return out


def load_points() -> list[dict]:
    with open(POINTS) as f:
        rows = [r for r in csv.DictReader(f)]
    for r in rows:
        r["shape"], r["config"] = _kv(r["shape"]), _kv(r["config"])
    return rows


# Whole kernel families the fit never sees (their error says how the model carries to a kernel it was not
# fitted on), and one row in three of the other families (by position in the CSV).
HELD_OUT_FAMILIES = ("aiter_moe_a8w4_stage2", "flash_attn_gfx950")


def held_out(i: int, kind: str = "") -> str:
    """"" (fitted), "held out" (one row in three of a fitted family) or "held out family"."""
    if kind in HELD_OUT_FAMILIES:
        return "held out family"
    return "held out" if i % 3 == 1 else ""


def _fp8_gemm(p: dict, flydsl: Path) -> dict:
    import torch
    from harness import emulator
    from benchmarks import costmodel

    if str(flydsl) not in sys.path:
        sys.path.insert(0, str(flydsl))
    from kernels.gemm.preshuffle_gemm import compile_preshuffle_gemm

    M, N, K = (p["shape"][k] for k in "MNK")
    c = p["config"]
    g = torch.Generator().manual_seed(0)
    # Counters do not depend on the values (no data-dependent control flow): small random codes suffice.
    a = torch.randint(0, 64, (M * K,), dtype=torch.uint8, generator=g).view(torch.int8)
    b = torch.randint(0, 64, (N * K,), dtype=torch.uint8, generator=g).view(torch.int8)
    out = torch.zeros(M * N, dtype=torch.bfloat16)
    sa, sb, bias = torch.ones(M), torch.ones(N), torch.empty(0, dtype=torch.bfloat16)
    wgs = -(-M // c["tile_m"]) * (N // c["tile_n"])
    n = SAMPLE_HEAVY if c["tile_m"] * c["tile_n"] * K > HEAVY_MACS else SAMPLE
    opts = dict(workgroup_sample=n, sample_seed=0) if wgs > SAMPLE_ABOVE else {}

    def run(wpe):
        fn = compile_preshuffle_gemm(N=N, K=K, tile_m=c["tile_m"], tile_n=c["tile_n"], tile_k=c["tile_k"],
                                     in_dtype="fp8", out_dtype="bf16", use_async_copy=bool(c["async_copy"]),
                                     waves_per_eu=wpe, xcd_swizzle=c["xcd_swizzle"], lds_stage=c["lds_stage"])
        with emulator.options(execute=False):
            fn(out, a, b, sa, sb, bias, M, N, None)  # compile and load outside the recorded run, execute nothing
        with emulator.options(**opts), emulator.launches() as recs:
            fn(out, a, b, sa, sb, bias, M, N, None)
        return [costmodel.launch_from_record(r) for r in recs]

    note = None
    try:
        launches = run(c["waves_per_eu"] or None)
    except emulator.LaunchError as e:
        if "scratch_" not in str(e) or not c["waves_per_eu"]:
            raise
        # With its waves-per-EU cap this LLVM spills (scratch), which the emulator does not run: emulate the
        # uncapped build (same instruction stream but for register allocation) and keep the capped occupancy.
        launches = run(None)
        for L in launches:
            L["waves_per_simd_override"] = c["waves_per_eu"]
        note = f"waves_per_eu={c['waves_per_eu']} spills here; emulated uncapped, occupancy {c['waves_per_eu']} kept"
    min_bytes = M * K + N * K + 2 * M * N + 4 * (M + N)
    return {"launches": launches, "dram_bytes": [min_bytes] if any(L["sampled"] for L in launches) else None,
            "note": note}


def _flash_attn(p: dict, flydsl: Path) -> dict:
    """FlyDSL's gfx950 dual-wave flash attention forward (BSHD bf16)."""
    import torch
    from harness import emulator
    from benchmarks import costmodel

    if str(flydsl) not in sys.path:
        sys.path.insert(0, str(flydsl))
    from kernels.attention.flash_attn_gfx950 import build_flash_attn_dualwave_swp_module

    B, S, H, HKV, D, causal = (p["shape"][k] for k in ("B", "S", "H", "HKV", "D", "causal"))
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


def _aiter_package(aiter: Path) -> None:
    """Import AITER's FlyDSL MoE modules from a checkout without running aiter/__init__.py (which loads its
    compiled extensions): bare package objects for the parents, a small dtypes namespace."""
    import logging
    import types

    import torch

    def pkg(name, path=None):
        m = sys.modules.get(name) or types.ModuleType(name)
        if path is not None:
            m.__path__ = [str(path)]
        sys.modules[name] = m
        return m

    root = pkg("aiter", aiter / "aiter")
    root.logger = logging.getLogger("aiter")
    pkg("aiter.ops", aiter / "aiter" / "ops")
    util = pkg("aiter.utility", aiter / "aiter" / "utility")
    d = pkg("aiter.utility.dtypes")
    d.fp8, d.fp4x2, d.fp8_e8m0 = torch.float8_e4m3fn, torch.float4_e2m1fn_x2, torch.float8_e8m0fnu
    d.bf16, d.fp16, d.fp32, d.i32 = torch.bfloat16, torch.float16, torch.float32, torch.int32
    util.dtypes = d
    pkg("aiter.ops.flydsl", aiter / "aiter" / "ops" / "flydsl")
    torch.cuda.current_stream = lambda *a, **k: None   # CPU torch has no streams; the launch takes none


def _moe_sorted(ids, experts: int, topk: int, block_m: int):
    """Routing buffers in AITER's moe_sorting format: per expert, its (slot << 24 | token) pairs padded to
    block_m with the sentinel (topk << 24 | tokens); one expert id per block; [padded rows, tokens]."""
    import torch

    tokens = ids.shape[0]
    sid, eid = [], []
    for e in range(experts):
        t, k = torch.where(ids == e)
        if not len(t):
            continue
        n = -(-len(t) // block_m) * block_m
        sid += ((k.to(torch.int32) << 24) | t.to(torch.int32)).tolist() + [(topk << 24) | tokens] * (n - len(t))
        eid += [e] * (n // block_m)
    return (torch.tensor(sid, dtype=torch.int32), torch.tensor(eid, dtype=torch.int32),
            torch.tensor([len(sid)], dtype=torch.int32))


def _moe_a8w4_stage1(p: dict, aiter: Path) -> dict:
    """AITER's FlyDSL a8w4 MoE gate-up GEMM (fp8 activations x MXFP4 weights, fused SwiGLU and fp8 quant),
    gate/up interleaved, random distinct top-k experts per token (the tuner's routing is random too)."""
    import torch
    from harness import emulator
    from benchmarks import costmodel

    _aiter_package(aiter)
    from aiter.ops.flydsl import moe_kernels

    sh, c = p["shape"], p["config"]
    T, H, I, E, topk = sh["tokens"], sh["model_dim"], sh["inter_dim"], sh["experts"], sh["topk"]
    g = torch.Generator().manual_seed(0)
    ids = torch.stack([torch.randperm(E, generator=g)[:topk] for _ in range(T)]).to(torch.int32)
    sid, eid, nvalid = _moe_sorted(ids, E, topk, c["tile_m"])
    a = torch.zeros(T, H, dtype=torch.uint8).view(torch.float8_e4m3fn)
    a_scale = torch.full(((-(-T // 256) + 1) * 256 * H // 32,), 127, dtype=torch.uint8)
    w1 = torch.empty(E, 2 * I, H // 2, dtype=torch.uint8)      # values do not change the counters
    w1_scale = torch.full((E * 2 * I * H // 32,), 127, dtype=torch.uint8)
    opts = dict(workgroup_sample=SAMPLE, sample_seed=0) if T > 1 else {}
    with emulator.options(**opts), emulator.launches() as recs:
        moe_kernels.flydsl_moe_stage1(a, w1, sid, eid, nvalid, topk=topk, tile_m=c["tile_m"], tile_n=c["tile_n"],
                                      tile_k=c["tile_k"], a_dtype="fp8", b_dtype="fp4", out_dtype="fp8",
                                      act="swiglu", w1_scale=w1_scale, a1_scale=a_scale,
                                      waves_per_eu=c["waves_per_eu"], b_nt=c["b_nt"], gate_mode="interleave",
                                      xcd_swizzle=c.get("xcd_swizzle", 0), k_wave=c.get("k_wave", 1))
    launches = [costmodel.launch_from_record(r) for r in recs]
    used = len(torch.unique(ids))
    dram = used * (2 * I * H // 2 + 2 * I * H // 32) + T * H * 33 // 32 + T * topk * I * 33 // 32
    return {"launches": launches, "dram_bytes": [dram] if any(L["sampled"] for L in launches) else None}


def _moe_a8w4_stage2(p: dict, aiter: Path) -> dict:
    """AITER's FlyDSL a8w4 MoE down GEMM (fp8 sorted intermediate x MXFP4 weights) with its epilogue as tuned:
    atomic accumulation into the output, or per-pair rows and AITER's reduce kernel (a second launch)."""
    import torch
    from harness import emulator
    from benchmarks import costmodel

    _aiter_package(aiter)
    from aiter.ops.flydsl import moe_kernels

    sh, c = p["shape"], p["config"]
    T, H, I, E, topk = sh["tokens"], sh["model_dim"], sh["inter_dim"], sh["experts"], sh["topk"]
    sbm = c.get("sort_block_m", 0) or c["tile_m"]
    g = torch.Generator().manual_seed(0)
    ids = torch.stack([torch.randperm(E, generator=g)[:topk] for _ in range(T)]).to(torch.int32)
    sid, eid, nvalid = _moe_sorted(ids, E, topk, sbm)
    inter = torch.zeros(T, topk, I, dtype=torch.uint8).view(torch.float8_e4m3fn)
    rows = -(-max(len(sid), len(eid) * sbm) // 256) * 256
    a2_scale = torch.full((rows * (-(-(I // 32) // 8) * 8),), 127, dtype=torch.uint8)
    w2 = torch.empty(E, H, I // 2, dtype=torch.uint8)
    w2_scale = torch.full((E * H * I // 32,), 127, dtype=torch.uint8)
    out = torch.zeros(T, H, dtype=torch.bfloat16)
    opts = dict(workgroup_sample=SAMPLE, sample_seed=0) if T > 1 else {}
    with emulator.options(**opts), emulator.launches() as recs:
        moe_kernels.flydsl_moe_stage2(inter, w2, sid, eid, nvalid, out, topk=topk, tile_m=c["tile_m"],
                                      tile_n=c["tile_n"], tile_k=c["tile_k"], a_dtype="fp8", b_dtype="fp4",
                                      out_dtype="bf16", mode=c["mode"], w2_scale=w2_scale, a2_scale=a2_scale,
                                      sort_block_m=c.get("sort_block_m", 0), persist=bool(c.get("persist", 0)) or None,
                                      b_nt=c["b_nt"])
    launches = [costmodel.launch_from_record(r) for r in recs]
    used = len(torch.unique(ids))
    gemm = used * (H * I // 2 + H * I // 32) + T * topk * I * 33 // 32 + T * H * 2 * (topk if c["mode"] == "reduce" else 1)
    reduce = T * H * 2 * (topk + 1)    # the reduce launch reads the per-pair rows and writes the output
    dram = [None if not L["sampled"] else reduce if "reduc" in L["kernel"] else gemm for L in launches]
    return {"launches": launches, "dram_bytes": dram if any(L["sampled"] for L in launches) else None}


RUNNERS = {"fp8_preshuffle_gemm": _fp8_gemm, "flash_attn_gfx950": _flash_attn, "aiter_moe_a8w4_stage1": _moe_a8w4_stage1,
           "aiter_moe_a8w4_stage2": _moe_a8w4_stage2}
NEEDS_AITER = {"aiter_moe_a8w4_stage1", "aiter_moe_a8w4_stage2"}


def emulate(points, flydsl: Path, aiter: Path, only=None) -> None:
    sys.path.insert(0, str(REPO))
    from harness import emulator

    emulator.install()
    CACHE.mkdir(parents=True, exist_ok=True)
    for p in points:
        out = CACHE / f"{p['point']}.json"
        if out.exists() or (CACHE / f"{p['point']}.failed").exists() or (only and p["point"] not in only):
            continue
        t0 = time.time()
        if p["kind"] in NEEDS_AITER and not (aiter / "aiter" / "ops" / "flydsl").is_dir():
            print(f"skipped {p['point']}: no AITER checkout at {aiter} (set AITER_SRC)", flush=True)
            continue
        try:
            res = RUNNERS[p["kind"]](p, aiter if p["kind"] in NEEDS_AITER else flydsl)
        except Exception as e:  # noqa: BLE001 - a point the emulator cannot run is reported, not fatal
            (CACHE / f"{p['point']}.failed").write_text(f"{type(e).__name__}: {e}"[:2000])
            print(f"not emulated {p['point']}: {type(e).__name__}: {str(e)[:300]}", flush=True)
            continue
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
BOUNDS = {"launch_us": (0.0, 10.0), "wait_cycles": (0.0, 2000.0), "barrier_cycles": (0.0, 4000.0), "hbm_efficiency": (0.4, 1.0), "overlap": (0.0, 1.0),
          "cu_bytes_per_clk": (4.0, 64.0)}


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
    ratios = {"fit": [], "held out": [], "held out family": []}
    for i, p, r in rows:
        pr = project(r, fit)
        ratio = pr["us"] / float(p["published_us"])
        s = held_out(i, p["kind"]) or "fit"
        ratios[s].append(ratio)
        if s == "held out family":
            ratios.setdefault(f"held out family {p['kind']}", []).append(ratio)
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
    ap.add_argument("--aiter", default=os.environ.get("AITER_SRC", "/tmp/aiter"),
                    help="AITER source checkout (its FlyDSL MoE kernels)")
    ap.add_argument("--emulate", action="store_true", help="emulate points missing from the cache")
    ap.add_argument("--only", help="comma-separated point names to emulate")
    ap.add_argument("--write", action="store_true", help="write the fitted constants to benchmarks/costmodel_fit.py")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(REPO))
    points = load_points()
    if args.emulate:
        emulate(points, Path(args.flydsl), Path(args.aiter), set(args.only.split(",")) if args.only else None)
    idx = {p["point"]: i for i, p in enumerate(points)}
    cached = load_cached(points)
    if not cached:
        sys.exit("no cached points: run with --emulate and a FlyDSL checkout")
    train = [(p, r) for p, r in cached if not held_out(idx[p["point"]], p["kind"])]
    fit, loss = fit_constants(train)
    text, summary = table([(idx[p["point"]], p, r) for p, r in cached], fit)
    print(text)
    for p in points:
        f = CACHE / f"{p['point']}.failed"
        if f.exists():
            print(f"| {p['point']} | {float(p['published_us']):.2f} | not emulated: {f.read_text().splitlines()[0][:160]} | | | |")
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
