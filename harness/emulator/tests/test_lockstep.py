"""Lockstep execution (lockstep.py) changes nothing the emulator promises.

Each kernel of the suite runs at a small token count once with every wave alone (lockstep=False, the
reference path) and once in lockstep, with every detector and the memory guard on: output bytes, counters
(per class, per MFMA mnemonic, bytes and distinct bytes, LDS bank conflicts, barriers) and the extent of the
stored bytes must be equal. The sanitizer's broken kernels must be reported, and their twins pass, on the
per-wave path too (the default run of test_sanitizer.py covers the lockstep path).
"""

from __future__ import annotations

import inspect

import pytest
import torch

from harness import emulator

emulator.install()

from amd_kernels import compile_watch  # noqa: E402
from harness import cases, checks, discovery  # noqa: E402
from harness.emulator.tests import test_sanitizer  # noqa: E402
from references import OPS  # noqa: E402

PACKAGES = discovery.discover()

# (kernel, tokens): every family of the suite; the MoE at a count it runs whole (it is the slow one)
KERNELS = [("norm/rmsnorm_h2880", 64), ("quant/mxfp8_k512", 32), ("gemm/mxfp8_n640_k2880", 32),
           ("moe/route_h2880_e128_top4", 16), ("moe/mxfp4_h2880_i384_e128_top4", 4)]
SHAPES = [(s, tokens) for kernel, tokens in KERNELS for s in cases.op_shapes() if s.kernel == kernel]
# Kernels where a ticket decides which wave does a piece of work (the routed MoE's down with the combine
# folded in: the last ticket-holder of a token's columns sums its rows). Which wave draws the last ticket
# depends on the arrival order, which differs between the two paths by design, and a wave holding several
# last tickets sums them in one pass: its instruction counts and scalar-load bytes follow. Everything else of
# these launches (bits, global bytes and distinct bytes, MFMAs, stores) must still be equal.
TICKET_KERNELS = ("_down_combine",)
ARRIVAL_DEPENDENT = ("wave_instructions", "instructions", "smem_bytes")


def test_every_listed_kernel_is_served():
    """A renamed package must not drop out of the equivalence runs silently."""
    assert {k for k, _ in KERNELS} == {s.kernel for s, _ in SHAPES}


@pytest.fixture(autouse=True)
def _compile_watch_as_before():
    """Calling an entry warms it up, which arms the compile watch for the whole process; these runs are
    checks of the emulator, not serving, so the watch is left as it was (other test modules compile after)."""
    armed = compile_watch._armed
    compile_watch._armed = False
    try:
        yield
    finally:
        compile_watch._armed = armed


def _run(shape, tokens, lockstep):
    pkg = PACKAGES[shape.kernel]
    entry = pkg.import_entries()[pkg.entry_for_op(shape.op)]
    seed = checks.seed_of(shape.id, tokens, tokens)
    clean = OPS[shape.op].build_inputs(tokens, shape.dims, seed)
    inputs = checks.to_device(pkg.entry_inputs(pkg.entry_for_op(shape.op), clean), "cpu")
    with emulator.options(workgroup_order_seed=seed, sanitize=True, interleave_seed=seed, lockstep=lockstep), \
            emulator.launches() as recs, emulator.guard(inputs):
        out = checks._as_tuple(entry(**inputs))
    got = [t.detach().contiguous().view(torch.uint8).flatten() for t in out]
    counters = [dict(r.counters, stored_bytes=int((r.stored[:, 1] - r.stored[:, 0]).sum()),
                     stored_runs=len(r.stored), executed=r.workgroups_executed) for r in recs]
    for r, c in zip(recs, counters):
        if r.kernel_name.endswith(TICKET_KERNELS):
            for key in ARRIVAL_DEPENDENT:
                c[key] = "arrival-dependent"
    return got, counters


@pytest.mark.parametrize("shape,tokens", SHAPES, ids=[f"{s.id}:m{t}" for s, t in SHAPES])
def test_kernel_same_bits_and_counters_both_ways(shape, tokens):
    alone, c_alone = _run(shape, tokens, lockstep=False)
    together, c_together = _run(shape, tokens, lockstep=True)
    assert c_together == c_alone
    assert len(alone) == len(together) and all(torch.equal(a, b) for a, b in zip(alone, together))
    assert sum(c["wave_instructions"] for c in c_alone if isinstance(c["wave_instructions"], int)) > 0


SANITIZER_TESTS = [name for name, fn in inspect.getmembers(test_sanitizer, inspect.isfunction)
                   if name.startswith("test_") and not inspect.signature(fn).parameters]


@pytest.mark.parametrize("name", SANITIZER_TESTS)
def test_sanitizer_reports_on_the_per_wave_path(name):
    with emulator.options(lockstep=False):
        getattr(test_sanitizer, name)()
