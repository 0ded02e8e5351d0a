"""python -m harness.emulator run SCRIPT [args...]: run a FlyDSL script on CPU tensors under the emulator,
then print each launch's counters and the emulated wave-instructions per second."""

from __future__ import annotations

import argparse
import json
import runpy
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.emulator")
    sub = parser.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="run a script under the emulator")
    run.add_argument("--json", action="store_true", help="print the launch records as JSON")
    run.add_argument("--sample", type=int, default=None, help="execute a seeded sample of N workgroups")
    run.add_argument("--order-seed", type=int, default=None, help="seeded workgroup order")
    run.add_argument("script")
    run.add_argument("args", nargs=argparse.REMAINDER)
    ns = parser.parse_args(argv)

    from harness import emulator

    emulator.install()
    sys.argv = [ns.script] + ns.args
    with emulator.launches() as recs, emulator.options(workgroup_order_seed=ns.order_seed,
                                                       workgroup_sample=ns.sample):
        try:
            runpy.run_path(ns.script, run_name="__main__")
        finally:
            _report(recs, ns.json)
    return 0


def _report(recs, as_json: bool) -> None:
    if as_json:
        print(json.dumps([dict(kernel=r.kernel_name, grid=r.grid, block=r.block, seconds=r.seconds,
                               workgroups_executed=r.workgroups_executed, counters=r.counters) for r in recs],
                         indent=1))
        return
    total_wi, total_s = 0, 0.0
    print(f"\n== emulator: {len(recs)} launch(es)")
    for r in recs:
        c = r.counters
        wi = c["wave_instructions"]
        total_wi += wi
        total_s += r.seconds
        rate = wi / r.seconds if r.seconds else 0.0
        print(f"{r.kernel_name} grid={r.grid} block={r.block} wg={c['workgroups']} waves={c['waves']} "
              f"wave-instr={wi} ({rate:,.0f}/s){' SAMPLED' if r.sampled else ''}")
        print(f"  classes {c['instructions']}")
        if c["mfma"]:
            print(f"  mfma {c['mfma']}")
        print(f"  global load {c['global_load_bytes']} B (distinct {c['global_load_distinct_bytes']}) "
              f"store {c['global_store_bytes']} B (distinct {c['global_store_distinct_bytes']}) "
              f"atomic {c['global_atomic_bytes']} B; lds read {c['lds_read_bytes']} write {c['lds_write_bytes']} "
              f"bank-conflict cycles {c['lds_bank_conflicts']}; barriers {c['barriers']}")
    if total_s:
        print(f"total {total_wi} wave-instructions in {total_s:.2f} s = {total_wi / total_s:,.0f} wave-instr/s")


if __name__ == "__main__":
    sys.exit(main())
