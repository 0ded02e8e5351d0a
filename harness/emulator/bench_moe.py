"""Emulator speed on a MoE block: python -m harness.emulator.bench_moe [--tokens 64] [--shape TOKEN] [--reps 3]
[--profile F]

Runs one MoE entry call as the suite's numerics check does (sampled token rows above the package's
`sample_above_tokens`, every detector and the memory guard on) and prints MFMAs and wave-instructions per
CPU second of the whole call (after a warm-up call that compiles and fills the caches), the fastest of
`--reps` calls (on a shared 2-core machine one call's CPU time varied 11-15 s).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import time

from harness import checks, discovery, importer
from harness import device as devices


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="moe/mxfp4_h2880_i2880_e128_top4")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3, help="timed calls (the figure is the fastest: a shared "
                    "machine's noise only adds time)")
    ap.add_argument("--profile", default=None, help="write a cProfile of the first timed call here")
    a = ap.parse_args()
    importer.expose_amd_kernels()
    devices.setup()
    from harness import emulator
    from references import OPS

    pkg = discovery.discover()[a.shape]
    entry_name = next(iter(pkg.entries))
    op_name = pkg.entries[entry_name]
    entry = pkg.import_entries()[entry_name]
    seed = checks.seed_of(a.shape, a.tokens)
    from harness import cases
    dims = next(s.dims for s in cases.op_shapes() if s.kernel == a.shape)
    clean = OPS[op_name].build_inputs(a.tokens, dims, seed)
    inputs = checks.to_device(pkg.entry_inputs(entry_name, clean), devices.current().torch_device)
    sample = checks.Case(pkg, entry, op_name, dims, a.tokens, a.tokens, seed).emulator_options()

    def call():
        with emulator.options(workgroup_order_seed=seed, sanitize=True, interleave_seed=seed, **sample), \
                emulator.launches() as recs, emulator.guard(inputs):
            entry(**inputs)
        return list(recs)

    call()
    times = []
    for rep in range(max(1, a.reps)):
        gc.collect()    # each timed call starts from the same heap (the warm-up's garbage is not its cost)
        prof = cProfile.Profile() if a.profile and rep == 0 else None
        t0 = time.process_time()
        if prof:
            prof.enable()
        recs = call()
        if prof:
            prof.disable()
            prof.dump_stats(a.profile)
        times.append(time.process_time() - t0)
    sec = min(times)
    mfma = sum(n for r in recs for n in r.counters.get("mfma", {}).values())
    wi = sum(r.wave_instructions for r in recs)
    print(f"{a.shape} m{a.tokens}: {mfma} MFMA, {wi} wave-inst in {sec:.2f} CPU s (fastest of "
          f"{' '.join(f'{t:.2f}' for t in times)}): {mfma / sec:,.0f} MFMA/s, {wi / sec:,.0f} w-inst/s")


if __name__ == "__main__":
    main()
