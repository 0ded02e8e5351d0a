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

# (kernel, tokens): every family of the suite, each at a count it runs whole; the MoE at few tokens (it is the
# slow one). The prefill attention runs its one-sequence shapes (both windows) at 64 query rows: its regime
# counts start at 256, and its batched shapes run the same two kernels at 5-40 s a case both ways.
KERNELS = [("norm/rmsnorm_h2880", 64), ("quant/mxfp8_k512", 32), ("gemm/mxfp8_n640_k2880", 32),
           ("moe/route_h2880_e128_top4", 16), ("moe/mxfp4_h2880_i384_e128_top4", 4),
           ("attention/rope_kv_q8_kv1_d64", 8), ("attention/paged_q8_kv1_d64", 4)]
PREFILL_ROWS = 64


def _count_for(shape, tokens: int) -> int:
    return tokens if any(c.phase == "decode" for c in shape.token_counts) else PREFILL_ROWS


SHAPES = [(s, _count_for(s, tokens)) for kernel, tokens in KERNELS for s in cases.op_shapes()
          if s.kernel == kernel and s.dims.get("prefill_sequences", 1) == 1]
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


def _poll_then_publish():
    """Both workgroups poll a flag (s_sleep between polls) until it equals 1 - workgroup id, then store 1
    into it: workgroup 1 passes at once and stores what workgroup 0 waits for. On a GPU both are resident and
    it finishes; a scheduler that lets the poller (the laggard by PC) spin never runs the store."""
    import flydsl.compiler as flyc
    import flydsl.expr as fx
    from flydsl.expr import rocdl

    acq, rel = fx.AtomicOrdering.Acquire, fx.AtomicOrdering.Release

    @flyc.kernel(name="lockstep_poll_then_publish", known_block_size=[64, 1, 1])
    def kernel(flag: fx.Tensor):
        slot = fx.add_offset(fx.get_iter(flag), fx.Int64(0))
        need = 1 - fx.block_idx.x
        v = fx.generic_load(slot, memory_order=acq, syncscope="one-as")
        while v != need:
            rocdl.s_sleep(1)
            v = fx.generic_load(slot, memory_order=acq, syncscope="one-as")
        fx.generic_store(slot, fx.Int32(1), memory_order=rel, syncscope="one-as")

    @flyc.jit
    def launch(flag: fx.Tensor, stream: fx.Stream = fx.Stream(None)):
        kernel(flag).launch(grid=(2, 1, 1), block=(64, 1, 1), stream=stream)

    return launch


def test_a_wave_polling_a_flag_yields_to_the_wave_that_stores_it(monkeypatch):
    """Lockstep scheduling of one batch: the poller (the laggard by PC) once ran until its flag came, which
    never did (the cause of the TP8 all-reduce's cross-rank hangs in CI, here within one launch); now a wave
    that executes s_sleep yields to the awake ones. Fails on the old scheduler with a RankHang."""
    from harness.emulator import ranks

    monkeypatch.setenv(ranks.TIMEOUT_ENV, "5")  # the old scheduler: a RankHang after 5 s, not a stuck test
    flag = torch.zeros(4, dtype=torch.int32)
    with emulator.options(lockstep=True):
        _poll_then_publish()(flag)
    assert flag[0].item() == 1
