"""The harness's command line.

  python -m harness run regimes/<model>.toml [--all] [--tokens 1,8,64] [--only gemm/] [--plan] [--no-exec]
                                            [--jobs N]
      warm up every kernel the regime names, then print per op and shape: warm-up (compile) time, ISA card
      of each variant, and, where a GPU or the emulator executes, one row per token count as it finishes:
      cosine, determinism and padding results, with the cost model's projected MI355X us
      (benchmarks/costmodel.py; multi-rank ops: each rank projects its own launches; the range over ranks is
      shown, its low end the rank that waited least for its peers, i.e. ranks arriving together). On the
      emulator the counts CI checks (kernel.toml [emulator] sets), --all every count. Results on stdout;
      a progress bar and the time left on stderr. Single-rank cases run in N worker processes (default on
      the emulator: one per core, memory permitting; on a GPU 1), multi-rank ops after them.
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


def plan(regime: str | Path, *, every: bool = False, tokens: set | None = None, emulated: bool = True,
         only: str = "") -> list:
    """What `harness run` checks, without running anything: [(shape, package, [TokenCount])] for each op
    shape the regime serves. By default the counts CI checks (KernelPackage.checked_by_default: on the
    emulator the kernel.toml [emulator] sets); `every`: all the regime's counts; `tokens`: these (whether CI
    checks them or not); `only`: the shapes whose kernel path contains it or whose op it names."""
    from harness import cases, discovery, regimes

    path = Path(regime)
    regimes.load(path)  # validate the file
    packages = discovery.discover()
    out = []
    for shape in cases.op_shapes([path.stem]):
        if only and only not in shape.kernel and only != shape.op:
            continue
        pkg = packages[shape.kernel]
        counts = [c for c in shape.token_counts
                  if (c.tokens in tokens if tokens else every or pkg.checked_by_default(shape.op, c.tokens, emulated))]
        out.append((shape, pkg, counts))
    return out


# The row of one token count, printed as it finishes: fixed-width columns first, then cosine and result
# (s: wall seconds of the case, cpu s: this process's CPU seconds, which a shared machine does not inflate).
ROW = [("tokens", 6), ("real", 6), ("determ.", 7), ("padding", 7), ("rows checked", 18), ("projected us", 12),
       ("s", 7), ("cpu s", 7), ("cosine", 0), ("result", 0)]
PARALLEL_ROW = [("case", 58)] + ROW  # --jobs: rows of several shapes interleave
MULTIRANK_ROW = [("tokens", 6), ("real", 6), ("ranks equal", 11), ("repeat equal", 12),
                 ("projected us (ranks: least-most waiting)", 40), ("s", 7), ("cosine", 0), ("result", 0)]


def _line(columns, cells) -> str:
    return "  ".join(str(c).ljust(w) for (_, w), c in zip(columns, cells)).rstrip()


def _print_header(out, columns) -> None:
    out(_line(columns, [h for h, _ in columns]))
    out(_line(columns, ["-" * max(w, len(h)) for h, w in columns]))


def cmd_run(args) -> int:
    if args.layer:
        return cmd_layer(args)
    dev = _setup()
    from harness import progress

    wanted_tokens = {int(t) for t in args.tokens.split(",")} if args.tokens else None
    emulated = dev.emulated
    work = plan(args.regime, every=args.all, tokens=wanted_tokens, emulated=emulated, only=args.only)
    if args.plan:
        for shape, _, counts in work:
            print(f"{shape.op} @ {shape.kernel}  ({', '.join(shape.served_by)}): {len(counts)} of "
                  f"{len(shape.token_counts)} counts: {' '.join(str(c.tokens) for c in counts)}")
        print(f"{sum(len(c) for *_, c in work)} cases")
        return 0
    if args.jobs is None:
        args.jobs = default_jobs(emulated)
    if args.jobs < 1:
        raise SystemExit(f"--jobs: expected a positive number of worker processes, got {args.jobs}")
    n_cases = 0 if args.no_exec else sum(len(c) for *_, c in work)
    scope = "every regime count (--all)" if args.all else ("the counts CI checks (--all: every count)"
                                                           if emulated else "every count")
    print(f"regime {Path(args.regime).stem} on {dev.kind}: {len(work)} op shapes, {n_cases} cases; {scope}",
          flush=True)
    bar = progress.Progress([(shape.id, shape.dims_json, [(c.tokens, c.real) for c in counts])
                             for shape, _, counts in work], executing=not args.no_exec, jobs=args.jobs)
    failed, carded, later = False, set(), []
    pool = _CasePool(args.jobs, bar) if args.jobs > 1 and not args.no_exec else None
    for shape, pkg, counts in work:
        entry = pkg.import_entries()[pkg.entry_for_op(shape.op)]
        bar.status(f"warming up {shape.op} @ {shape.kernel}")
        start = time.perf_counter()
        report = entry.warm_up()
        warm_s = time.perf_counter() - start
        bar.warmed(shape.id, shape.dims_json, warm_s)
        if pool:
            failed |= pool.print_finished()
        bar.out(f"\n== {shape.op} @ {shape.kernel}  (served by {', '.join(shape.served_by)})")
        bar.out(f"dims {shape.dims_json}")
        if report:
            bar.out(f"warm-up {warm_s:.2f} s: {report['compiled']} of {report['variants']} variants compiled, "
                    "the rest loaded from the disk cache")
        else:
            bar.out("already warm in this process")
        if id(entry) in carded:  # another shape of the same entry: the same variants
            bar.out("ISA cards: as above")
        else:
            carded.add(id(entry))
            card_rows = [_card_row(k, c) for k, c in _cards_of(entry)]
            bar.out(_table(CARD_HEADERS, card_rows))
            failed |= any(r[-1] != "ok" for r in card_rows)
        if args.no_exec:
            continue
        bar.out(f"{len(counts)} of {len(shape.token_counts)} token counts"
                + ("" if len(counts) == len(shape.token_counts) else " (--all: every count)")
                + (" (rows below, as they finish)" if counts and pool and pkg.ranks == 1 else ""))
        if not counts:
            continue
        if pkg.ranks > 1:  # multi-rank kernels run on pkg.ranks ranks (harness/multirank.py)
            if pool:  # its rank processes take every core: after the pool's cases
                bar.out("(after the other shapes' cases: its ranks need every core)")
                later.append((pkg, shape, counts))
            else:
                failed |= _run_multirank(pkg, shape, counts, bar)
            continue
        if pool:
            pool.submit(shape, pkg, counts)
            continue
        _print_header(bar.out, ROW)
        for count in counts:
            bar.status(f"{shape.op} @ {shape.kernel} at {count.tokens} tokens")
            cells, bad, seconds = run_case(pkg.path, shape.op, shape.dims, shape.id, count.tokens, count.real)
            failed |= bad
            bar.done(shape.id, shape.dims_json, (count.tokens, count.real), seconds)
            bar.out(_line(ROW, cells))
    if pool:
        failed |= pool.finish()
        for pkg, shape, counts in later:
            bar.out(f"\n== {shape.op} @ {shape.kernel}")
            failed |= _run_multirank(pkg, shape, counts, bar)
    bar.finish()
    return 1 if failed else 0


JOB_MEMORY_GIB = 6  # what one emulator worker may hold (a TP1 MoE case: prepared weights, inputs, two runs)


def default_jobs(emulated: bool) -> int:
    """On the emulator one worker per core, as many as the machine's memory holds; on a GPU one process (the
    cases share the device, and a case times its own launches)."""
    if not emulated:
        return 1
    try:
        mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        mem_gib = JOB_MEMORY_GIB
    return max(1, min(os.cpu_count() or 1, int(mem_gib // JOB_MEMORY_GIB)))


def run_case(path: str, op: str, dims: dict, shape_id: str, tokens: int, real: int) -> tuple[list, bool, float]:
    """One case of `harness run`, in this process or a --jobs worker: (ROW cells, failed, wall seconds)."""
    from harness import checks, discovery
    from references import OPS

    pkg = discovery.discover()[path]
    entry = pkg.import_entries()[pkg.entry_for_op(op)]
    entry.warm_up()  # a worker loads what the parent's warm-up compiled (the disk cache)
    start, cpu = time.perf_counter(), time.process_time()
    try:
        res = checks.check_case(pkg, entry, op, dims, tokens, real, checks.seed_of(shape_id, tokens, real))
    except Exception as e:  # e.g. a SanitizerReport: this row fails, the run goes on
        return _failed_cells(tokens, real, e), True, time.perf_counter() - start
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    bad = res.failures(OPS[op].cosine_min)
    return ([tokens, real, "yes" if res.deterministic else "NO", "yes" if res.padding_harmless else "NO",
             f"{res.rows_checked}/{res.rows_real}" + (" sampled" if res.sampled else ""), _projected(res.launches),
             f"{seconds:.1f}", f"{cpu:.1f}", " ".join(f"{n}={c:.6f}" for n, c in res.cosines.items()),
             "ok" if not bad else "; ".join(bad)], bool(bad), seconds)


def _failed_cells(tokens: int, real: int, e: Exception) -> list:
    return [tokens, real, "-", "-", "-", "-", "-", "-", "-",
            f"FAILED: {type(e).__name__}: {(str(e).splitlines() or [''])[0]}"]


class _CasePool:
    """--jobs N: single-rank cases run in N worker processes (spawned: a fork would copy the parent's
    threads' locks); each row prints when it finishes, after its shape's header, with the shape named."""

    def __init__(self, jobs: int, bar):
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        self.bar = bar
        self.executor = ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"),
                                            initializer=_setup)
        self.futures = []  # (future, shape, count), in submission order
        self.header = False

    def submit(self, shape, pkg, counts) -> None:
        for c in counts:
            fut = self.executor.submit(run_case, pkg.path, shape.op, shape.dims, shape.id, c.tokens, c.real)
            self.futures.append((fut, shape, c))

    def _print(self, item) -> bool:
        fut, shape, c = item
        try:
            cells, bad, seconds = fut.result()
        except Exception as e:  # the worker died (e.g. out of memory): this row fails, the run goes on
            cells, bad, seconds = _failed_cells(c.tokens, c.real, e), True, 0.0
        if not self.header:
            _print_header(self.bar.out, PARALLEL_ROW)
            self.header = True
        self.bar.done(shape.id, shape.dims_json, (c.tokens, c.real), seconds)
        self.bar.out(_line(PARALLEL_ROW, [f"{shape.op} @ {shape.kernel}"] + cells))
        return bad

    def print_finished(self) -> bool:
        done, running = [], []
        for f in self.futures:  # one look at each future: one finishing meanwhile is printed next time
            (done if f[0].done() else running).append(f)
        self.futures = running
        return any([self._print(f) for f in done])

    def finish(self) -> bool:
        from concurrent.futures import FIRST_COMPLETED, wait

        failed = False
        while self.futures:
            self.bar.status(f"{len(self.futures)} cases running or queued on the workers")
            wait([f for f, *_ in self.futures], return_when=FIRST_COMPLETED)
            failed |= self.print_finished()
        self.executor.shutdown()
        return failed


def _projected(launches) -> str:
    """The cost model's projected MI355X time of the case's launches (benchmarks/costmodel.py; '~' when a
    launch ran a sample of its workgroups, whose counters the model scales to the grid)."""
    if not launches:
        return "-"
    from benchmarks import costmodel

    us = costmodel.project_records(launches)["us"]
    return f"{'~' if any(r.workgroups_executed is not None for r in launches) else ''}{us:.2f}"


def _run_multirank(pkg, shape, counts, bar) -> bool:
    """All of the shape's counts in one set of rank processes (starting them costs more than a case): the
    rows print when the last count is done."""
    from harness import checks, multirank
    from references import OPS

    bar.status(f"{shape.op} @ {shape.kernel}: {len(counts)} counts on {pkg.ranks} ranks")
    start = time.perf_counter()
    triples = [(c.tokens, c.real, checks.seed_of(shape.id, c.tokens, c.real) % 100_000) for c in counts]
    try:
        results = multirank.check_cases(pkg.module, pkg.entry_for_op(shape.op), shape.op, shape.dims, triples,
                                        world=pkg.ranks, sample_above=pkg.sample_above(shape.op))
    except Exception as e:  # e.g. a rank waiting too long for its peers on a busy machine: the run goes on
        bar.out(f"FAILED: {type(e).__name__}: {(str(e).splitlines() or [''])[0]}")
        for c in counts:
            bar.done(shape.id, shape.dims_json, (c.tokens, c.real), 0.0)
        return True
    seconds = (time.perf_counter() - start) / len(counts)
    _print_header(bar.out, MULTIRANK_ROW)
    failed = False
    for c, res in zip(counts, results):
        bad = res.failures(OPS[shape.op].cosine_min)
        failed |= bool(bad)
        bar.done(shape.id, shape.dims_json, (c.tokens, c.real), seconds)
        # the least-waiting rank: an emulated rank that starts early polls flags for the emulator's time
        projected = (f"{min(res.projected_us):.2f}-{max(res.projected_us):.2f}" if res.projected_us else "-")
        bar.out(_line(MULTIRANK_ROW, [c.tokens, c.real, "yes" if res.ranks_equal else "NO",
                                      "yes" if res.repeat_equal else "NO", projected, f"~{seconds:.1f}",
                                      " ".join(f"{n}={v:.6f}" for n, v in res.cosines.items()),
                                      "ok" if not bad else "; ".join(bad)]))
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
            if not dev.emulated:
                rows.append(head + ["-", "-", "-", "-"])
                continue
            res = layer_bench.measure_step(st.kernel, op, dims[(st.kernel, op)], t)
            names = " + ".join(f"{L['kernel']}{L['grid']}" + (" sampled" if L.get("sampled") else "")
                               for L in res["launches"]) + (f" ({pkg.ranks} ranks)" if pkg.ranks > 1 else "")
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
    run.add_argument("--all", action="store_true",
                     help="on the emulator, check every regime token count (default: the counts CI checks, "
                          "the kernel.toml [emulator] sets; a GPU always checks every count)")
    run.add_argument("--tokens", help="comma-separated token counts to execute (any regime count)")
    run.add_argument("--only", default="", help="only the kernels whose path contains this (e.g. gemm/, "
                                                "moe/mxfp4) or the op it names")
    run.add_argument("--plan", action="store_true", help="list the op shapes and token counts it would check, "
                                                         "then stop")
    run.add_argument("--no-exec", action="store_true", help="compile and print ISA cards only")
    run.add_argument("--jobs", type=int, default=None,
                     help="worker processes for the single-rank cases (default on the emulator: one per core, "
                          f"at most one per {JOB_MEMORY_GIB} GiB of memory; on a GPU 1; 1: in this process, rows "
                          "under their shape)")
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
