"""Eager host cost per call of every single-rank entry, at each regime shape (the runner's measure).

    ./env.sh python3 -m benchmarks.host_cost [--tokens 8] [--only SUBSTRING] [--profile]

Launches run no kernel code (the emulator's execute=False; the HIP substitute's launch path is included); the
figure is CPU microseconds per call (benchmarks.runner.host_us_per_call). --profile adds a cProfile of 2000
calls of each selected entry (sorted by own time): where the time goes. The all-reduce needs its 8 ranks: the
runner measures it (`python -m benchmarks.runner comm/allreduce_ranks8_h2880`).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--only", help="measure the entries whose '<package>:<entry>' contains this")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args(argv)

    from benchmarks.runner import _setup, host_us_per_call

    _setup()
    from harness import cases, discovery, emulator
    from references import OPS

    packages = discovery.discover()
    for shape in cases.op_shapes():
        pkg = packages[shape.kernel]
        if pkg.ranks > 1:
            continue
        name = pkg.entry_for_op(shape.op)
        key = f"{shape.kernel}:{name}"
        if args.only and args.only not in key:
            continue
        entry = pkg.import_entries()[name]
        inputs = pkg.entry_inputs(name, OPS[shape.op].build_inputs(args.tokens, shape.dims, 0))
        entry.warm_up()
        us = host_us_per_call(entry, inputs)
        dims = json.dumps(shape.dims, sort_keys=True)
        print(f"{key:52s} {'-' if us is None else f'{us:6.1f}'} us/call  {dims[:60]}", flush=True)
        if args.profile:
            prof = cProfile.Profile()
            with emulator.options(execute=False):
                prof.enable()
                for _ in range(2000):
                    entry(**inputs)
                prof.disable()
            text = io.StringIO()
            pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(20)
            print(text.getvalue())


if __name__ == "__main__":
    main()
