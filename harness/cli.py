"""The harness's command line.

  python -m harness run regimes/<model>.toml [--tokens 1,8,64] [--no-exec]
      warm up every kernel the regime names, then print one table per op and shape: warm-up (compile)
      time, ISA card of each variant, and, where a GPU or the emulator executes, cosine, determinism and
      padding results per token count, with the cost model's projected MI355X us (benchmarks/costmodel.py;
      multi-rank ops: each rank projects its own launches; the range over ranks is shown, its low end the
      rank that waited least for its peers, i.e. ranks arriving together).
  python -m harness run regimes/<model>.toml --layer [--tp 1] [--tokens 1,8,64,256]
      the regime's decoder layer ([[layer]]): each step's entry, its warm-up time, and at each decode token
      count the kernels it launches, the cost model's projected us and the floor, per step and in total
  python -m harness isa [--json]     every variant's ISA card
  python -m harness list [--json]    registered kernel packages: op, shape token, entries, regime ops
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def _setup():
    from harness import device, importer

    importer.expose_amd_kernels()
    return device.setup()


def _table(headers: list[str], rows: list[list]) -> str:
    cells = [headers] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    line = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths))  # noqa: E731
    return "\n".join([line(cells[0]), line(["-" * w for w in widths])] + [line(r) for r in cells[1:]])


def _cards_of(entry) -> list[tuple[str, object]]:
    from harness.isa import cards, code_object_of

    keys = sorted({k for ks in entry.modes.values() for k in ks})
    return [(key, card) for key in keys for card in cards(code_object_of(entry.table[key]))]


def _card_row(key, card) -> list:
    mfma = sum(card.mfma.values())
    loads = ",".join(f"{m}x{n}" for m, n in card.global_loads.items()) or "-"
    bad = "; ".join(card.violations()) or "ok"
    return [key, card.vgprs, card.agprs, card.sgprs, card.lds_bytes, card.scratch_bytes, card.waves_per_simd,
            mfma, loads, bad]


CARD_HEADERS = ["variant", "vgpr", "agpr", "sgpr", "lds", "scratch", "waves/simd", "mfma", "global loads", "rules"]


def cmd_run(args) -> int:
    if args.layer:
        return cmd_layer(args)
    dev = _setup()
    from harness import cases, checks, discovery, regimes
    from references import OPS

    path = Path(args.regime)
    regime_name = path.stem
    regimes.load(path)  # validate the file
    packages = discovery.discover()
    wanted_tokens = {int(t) for t in args.tokens.split(",")} if args.tokens else None
    failed = False
    print(f"regime {regime_name} on {dev.kind}")
    for shape in cases.op_shapes([regime_name]):
        pkg = packages[shape.kernel]
        entry = pkg.import_entries()[pkg.entry_for_op(shape.op)]
        start = time.perf_counter()
        report = entry.warm_up()
        warm_s = time.perf_counter() - start
        print(f"\n== {shape.op} @ {shape.kernel}  (served by {', '.join(shape.served_by)})")
        if report:
            print(f"warm-up {warm_s:.2f} s: {report['compiled']} of {report['variants']} variants compiled, "
                  "the rest loaded from the disk cache")
        else:
            print("already warm in this process")
        card_rows = [_card_row(k, c) for k, c in _cards_of(entry)]
        print(_table(CARD_HEADERS, card_rows))
        failed |= any(r[-1] != "ok" for r in card_rows)
        if args.no_exec:
            continue
        rows = []
        if pkg.ranks > 1:  # multi-rank kernels run on pkg.ranks ranks (harness/multirank.py)
            failed |= _run_multirank(pkg, shape, wanted_tokens)
            continue
        for count in shape.token_counts:
            if wanted_tokens and count.tokens not in wanted_tokens:
                continue
            seed = checks.seed_of(shape.id, count.tokens, count.real)
            res = checks.check_case(pkg, entry, shape.op, shape.dims, count.tokens, count.real, seed)
            bad = res.failures(OPS[shape.op].cosine_min)
            failed |= bool(bad)
            cos = " ".join(f"{n}={c:.6f}" for n, c in res.cosines.items())
            rows.append([count.tokens, count.real, cos, "yes" if res.deterministic else "NO",
                         "yes" if res.padding_harmless else "NO",
                         f"{res.rows_checked}/{res.rows_real}" + (" sampled" if res.sampled else ""),
                         _projected(res.launches), "ok" if not bad else "; ".join(bad)])
        print(_table(["tokens", "real", "cosine", "deterministic", "padding harmless", "rows checked",
                      "projected us", "result"], rows))
    return 1 if failed else 0


def _projected(launches) -> str:
    """The cost model's projected MI355X time of the case's launches (benchmarks/costmodel.py; '~' when a
    launch ran a sample of its workgroups, whose counters the model scales to the grid)."""
    if not launches:
        return "-"
    from benchmarks import costmodel

    us = costmodel.project_records(launches)["us"]
    return f"{'~' if any(r.workgroups_executed is not None for r in launches) else ''}{us:.2f}"


def _run_multirank(pkg, shape, wanted_tokens) -> bool:
    from harness import checks, multirank
    from references import OPS

    counts = [c for c in shape.token_counts if not wanted_tokens or c.tokens in wanted_tokens]
    if not counts:
        return False
    triples = [(c.tokens, c.real, checks.seed_of(shape.id, c.tokens, c.real) % 100_000) for c in counts]
    results = multirank.check_cases(pkg.module, pkg.entry_for_op(shape.op), shape.op, shape.dims, triples,
                                    world=pkg.ranks)
    rows, failed = [], False
    for c, res in zip(counts, results):
        bad = res.failures(OPS[shape.op].cosine_min)
        failed |= bool(bad)
        cos = " ".join(f"{n}={v:.6f}" for n, v in res.cosines.items())
        # the least-waiting rank: an emulated rank that starts early polls flags for the emulator's time
        projected = (f"{min(res.projected_us):.2f}-{max(res.projected_us):.2f}" if res.projected_us else "-")
        rows.append([c.tokens, c.real, cos, "yes" if res.ranks_equal else "NO",
                     "yes" if res.repeat_equal else "NO", projected, "ok" if not bad else "; ".join(bad)])
    print(_table(["tokens", "real", "cosine", f"{pkg.ranks} ranks equal", "repeat equal",
                  "projected us (ranks: least-most waiting)", "result"], rows))
    return failed


def cmd_layer(args) -> int:
    """The regime's decoder layer ([[layer]], a full-attention layer's steps): each step's entry, warm-up time,
    and at each decode token count its launches (variants), projected MI355X us and floor, and the layer's
    totals (benchmarks/layer.py: how each step is run and costed)."""
    dev = _setup()
    from benchmarks import layer as layer_bench
    from harness import cases, chain, discovery

    layer = chain.load_layer(args.regime, args.tp)
    tokens = [int(t) for t in (args.tokens or "1,8,64,256").split(",")]
    print(f"layer of {Path(args.regime).name} at TP{layer.tp} ({', '.join(layer.phases)}) on {dev.kind}: "
          f"decode, attention over {layer_bench.CONTEXT} keys per sequence (full layer); us are PROJECTED by "
          "benchmarks/costmodel.py (a model, not a measurement)" + ("" if dev.emulated else " - n/a on a GPU"))
    dims = {(s.kernel, s.op): s.dims for s in cases.op_shapes([Path(args.regime).stem])}
    packages = discovery.discover()
    warm, rows, totals = {}, [], {t: [0.0, 0.0] for t in tokens}
    for st in layer.steps:
        key = f"{st.kernel}.{st.entry}"
        pkg = packages[st.kernel]
        op = pkg.entries[st.entry]
        if key not in warm:
            start = time.perf_counter()
            chain._entry(st.kernel, st.entry)[1].warm_up()
            warm[key] = time.perf_counter() - start
        for i, t in enumerate(tokens):
            head = [st.name if i == 0 else "", key if i == 0 else "", f"{warm[key]:.2f}" if i == 0 else "", t]
            if pkg.ranks > 1 or not dev.emulated:
                rows.append(head + [f"({pkg.ranks} ranks: not costed here)" if pkg.ranks > 1 else "-", "-", "-", "-"])
                continue
            res = layer_bench.measure_step(st.kernel, op, dims[(st.kernel, op)], t)
            names = " + ".join(f"{L['kernel']}{L['grid']}" + (" sampled" if L["sampled"] else "")
                               for L in res["launches"])
            totals[t][0] += res["projected_us"]
            totals[t][1] += res["floor_us"]
            rows.append(head + [names, f"{res['projected_us']:.2f}", f"{res['floor_us']:.3f}",
                                f"{res['projected_us'] / res['floor_us']:.1f}"])
            print(f"  {st.name} at {t} tokens: projected {res['projected_us']:.2f} us, floor {res['floor_us']:.3f} us",
                  flush=True)
    for t in tokens:
        p, f = totals[t]
        rows.append(["layer total" if t == tokens[0] else "", "", "", t, "costed steps", f"{p:.2f}", f"{f:.3f}",
                     f"{p / f:.1f}" if f else "-"])
    print(_table(["step", "entry", "warm-up s", "tokens", "launches [grid] (variant)", "projected us", "floor us",
                  "x floor"], rows))
    return 0


def _all_entries():
    from harness import cases, discovery

    packages = discovery.discover()
    seen = {}
    for shape in cases.op_shapes():
        pkg = packages[shape.kernel]
        name = pkg.entry_for_op(shape.op)
        seen[(pkg.path, name)] = (pkg, pkg.import_entries()[name])
    return seen


def cmd_isa(args) -> int:
    _setup()
    found = []  # (kernel path, entry name, variant key, card)
    for (path, name), (_, entry) in _all_entries().items():
        entry.warm_up()
        found += [(path, name, key, card) for key, card in _cards_of(entry)]
    if args.json:
        print(json.dumps([{"kernel": p, "entry": n, "variant": k, **c.as_dict(), "violations": c.violations()}
                          for p, n, k, c in found], indent=1))
    else:
        print(_table(["kernel"] + CARD_HEADERS, [[p] + _card_row(k, c) for p, _, k, c in found]))
    return 1 if any(c.violations() for *_, c in found) else 0


def cmd_list(args) -> int:
    from harness import cases, discovery

    served: dict = {}
    for shape in cases.op_shapes():
        served.setdefault(shape.kernel, []).append({"op": shape.op, "served_by": list(shape.served_by)})
    rows = [{"kernel": p.path, "category": p.path.split("/")[0], "shape_token": p.path.split("/")[1],
             "module": p.module, "entries": p.entries, "regime_ops": served.get(p.path, [])}
            for p in discovery.discover().values()]
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(_table(["kernel", "entries", "regime ops"],
                     [[r["kernel"], ", ".join(r["entries"]),
                       "; ".join(f"{o['op']} ({', '.join(o['served_by'])})" for o in r["regime_ops"])]
                      for r in rows]))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="warm up and check every kernel a regime names")
    run.add_argument("regime", help="regimes/<model>.toml")
    run.add_argument("--tokens", help="comma-separated token counts to execute (default: all)")
    run.add_argument("--no-exec", action="store_true", help="compile and print ISA cards only")
    run.add_argument("--layer", action="store_true",
                     help="the regime's decoder layer: each step's entry, warm-up, launches, projected us and floor "
                          "per token count")
    run.add_argument("--tp", type=int, default=1, help="with --layer: the TP size's chain (default 1)")
    isa = sub.add_parser("isa", help="print every variant's ISA card")
    isa.add_argument("--json", action="store_true")
    lst = sub.add_parser("list", help="list registered kernel packages")
    lst.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    os.environ.setdefault("AMD_KERNELS_COMPILE_ERROR", "0")
    return {"run": cmd_run, "isa": cmd_isa, "list": cmd_list}[args.command](args)
