"""PNG figures of the runner's projections (`python -m benchmarks.runner ... --plot DIR`).

Every figure shows the cost model's PROJECTED MI355X time (benchmarks/costmodel.py), never a measurement:
- `roofline.png`: each kernel's points (one per op and token count) at its arithmetic intensity (FLOPs over the
  bytes it moves: distinct bytes, or the minimum when the run was sampled) and its projected FLOP/s, under the
  MI355X roofs (8 TB/s HBM; 5 PFLOP/s MXFP8/FP8, 2.5 PFLOP/s BF16 dense). Ops without FLOPs are left out.
- `<category>_<shape token>.png`: projected us against token count per op, the floor (max of bytes / 8 TB/s,
  FLOPs / peak, link bytes / xGMI), and the published anchors the bench lists (ANCHORS in its bench.py, from the
  issues: MoE 15, all-reduce 14, attention 12), each labelled with its source and shape.

matplotlib is an optional extra (`pip install 'amd_kernels[plot]'`); nothing else imports this module.
"""

from __future__ import annotations

import importlib
from pathlib import Path

EXTRA = "plot"


def require_matplotlib():
    """matplotlib's pyplot on the Agg backend, or an error naming the optional extra."""
    try:
        import matplotlib
    except ImportError as err:
        raise SystemExit(f"--plot needs matplotlib, the optional extra '{EXTRA}': "
                         f"pip install 'amd_kernels[{EXTRA}]' (or pip install matplotlib)") from err
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _anchors(bench_name: str) -> list[dict]:
    try:
        mod = importlib.import_module("benchmarks." + bench_name.replace("/", ".") + ".bench")
    except ImportError:
        return []
    return list(getattr(mod, "ANCHORS", ()))


def _bytes_moved(row: dict) -> float:
    distinct = row.get("bytes_distinct")
    return distinct if isinstance(distinct, (int, float)) and distinct == distinct and distinct else row["min_bytes"]


def roofline(results: dict, path: Path) -> Path:
    from benchmarks import runner

    plt = require_matplotlib()
    fig, ax = plt.subplots(figsize=(8, 6))
    xs = [10 ** (i / 10) for i in range(-20, 51)]
    for peak, name in ((runner.MXFP8_FLOPS_PER_S, "MXFP8/FP8 5 PFLOP/s"), (2.5e15, "BF16 2.5 PFLOP/s")):
        ax.plot(xs, [min(peak, x * runner.HBM_BYTES_PER_S) for x in xs], "--", lw=1, label=f"roof: {name}, 8 TB/s")
    markers = "os^vD<>ph*"
    for i, (bench, rows) in enumerate(sorted(results.items())):
        pts = [(r["flops"] / _bytes_moved(r), r["flops"] / (r["projected_us"] * 1e-6)) for r in rows
               if r.get("flops") and r.get("projected_us")]
        if pts:
            ax.scatter(*zip(*pts), marker=markers[i % len(markers)], color=plt.cm.tab20(i % 20),
                       label=f"{bench} (projected)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity, FLOP / byte moved")
    ax.set_ylabel("projected FLOP/s on MI355X (cost model, not measured)")
    ax.set_title("Roofline: PROJECTED by benchmarks/costmodel.py (not measured)", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(True, which="both", lw=0.3)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=110)
    plt.close(fig)
    return path


def versus_tokens(bench: str, rows: list[dict], path: Path) -> Path:
    plt = require_matplotlib()
    fig, ax = plt.subplots(figsize=(8, 5.5))
    ops = list(dict.fromkeys(r.get("op", "") for r in rows))
    for op in ops:
        mine = sorted((r for r in rows if r.get("op", "") == op), key=lambda r: r["tokens"])
        t = [r["tokens"] for r in mine]
        line, = ax.plot(t, [r["projected_us"] for r in mine], "o-", label=f"{op}: projected")
        ax.plot(t, [r["floor_us"] for r in mine], ":", color=line.get_color(), label=f"{op}: floor")
    anchor_markers = "xP*Dv^<>sp"
    for i, a in enumerate(a for a in _anchors(bench) if not a.get("op") or a["op"] in ops):
        ax.scatter([a["tokens"]], [a["us"]], marker=anchor_markers[i % len(anchor_markers)], s=50, color="black",
                   zorder=5, label=f"published anchor: {a['label']}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("tokens")
    ax.set_ylabel("us per call")
    ax.set_title(f"{bench}: PROJECTED MI355X time (cost model, not measured)", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(True, which="both", lw=0.3)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=110)
    plt.close(fig)
    return path


def write_all(results: dict, out_dir) -> list[Path]:
    """results: bench name -> the runner's rows (emulator rows: the GPU runner's measure, not project). -> paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    projected = {b: [r for r in rows if "projected_us" in r] for b, rows in results.items()}
    projected = {b: rows for b, rows in projected.items() if rows}
    if not projected:
        return []
    paths = [roofline(projected, out / "roofline.png")]
    for bench, rows in sorted(projected.items()):
        paths.append(versus_tokens(bench, rows, out / (bench.replace("/", "_") + ".png")))
    return paths
