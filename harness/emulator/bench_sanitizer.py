"""Emulator speed with and without the sanitizer: python -m harness.emulator.bench_sanitizer

Runs the RMSNorm family entries (buffer loads/stores, no LDS) at 512 tokens (all 128 workgroups) and a vector
add, each with the detectors off, with sanitize=True (waits, hazards, races, interleaving) and with memory
checking added, and prints emulated wave-instructions per CPU second of the whole call (best of 5).
"""

from __future__ import annotations

import time

import torch

from harness import importer
from harness import device as devices


class _Case:
    def __init__(self, entry, inputs):
        self.entry, self.inputs = entry, inputs

    def make(self):
        return [v.clone() if isinstance(v, torch.Tensor) else v for v in self.inputs.values()]

    def __call__(self, *args):
        return self.entry(**dict(zip(self.inputs, args)))


def _measure(fn, mode):
    from harness import emulator

    best = None
    for _ in range(5):
        args = fn.make()
        san = dict(sanitize=True) if mode != "off" else dict(sanitize=None)
        guard = emulator.guard(args) if mode == "all" else None
        t0 = time.process_time()
        with emulator.options(**san), emulator.launches() as recs:
            if guard is not None:
                with guard:
                    fn(*args)
            else:
                fn(*args)
        sec = time.process_time() - t0          # CPU time: robust against other processes on the machine
        wi = sum(r.wave_instructions for r in recs)
        rate = wi / sec
        best = rate if best is None or rate > best else best
    return wi, best


def main():
    importer.expose_amd_kernels()
    devices.setup()
    from amd_kernels.norm import rmsnorm_h2880 as pkg
    from references import OPS

    cases = []
    for name in ("rmsnorm", "fused_add_rmsnorm", "rmsnorm_mxfp8", "fused_add_rmsnorm_mxfp8"):
        entry = getattr(pkg, name)
        op = OPS[name]

        cases.append((f"rmsnorm_h2880.{name} m512", _Case(entry, op.build_inputs(512, {"hidden": 2880, "eps": 1e-5}, 0))))
    print(f"{'case':44s} {'wave-inst':>9s} {'off /s':>9s} {'sanitize /s':>12s} {'+memcheck /s':>13s}  cost")
    tot = {"off": [0, 0.0], "san": [0, 0.0], "all": [0, 0.0]}
    for label, fn in cases:
        rates = {}
        for mode in ("off", "san", "all"):
            wi, rates[mode] = _measure(fn, mode)
            tot[mode][0] += wi
            tot[mode][1] += wi / rates[mode]
        print(f"{label:44s} {wi:9d} {rates['off']:9.0f} {rates['san']:12.0f} {rates['all']:13.0f}  "
              f"{100 * (rates['off'] / rates['all'] - 1):+.0f}%")
    r = {k: v[0] / v[1] for k, v in tot.items()}
    print(f"{'total':44s} {tot['off'][0]:9d} {r['off']:9.0f} {r['san']:12.0f} {r['all']:13.0f}  "
          f"{100 * (r['off'] / r['all'] - 1):+.0f}%")


if __name__ == "__main__":
    main()
