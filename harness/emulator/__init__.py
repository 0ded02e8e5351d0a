"""A gfx950 (MI355X, CDNA4, wave64) emulator that runs FlyDSL kernels on a CPU.

    from harness import emulator
    emulator.install()            # before FlyDSL's runtime loads; idempotent
    with emulator.launches() as recs, emulator.options(workgroup_sample=8):
        my_flydsl_fn(x_cpu, y_cpu)        # CPU torch tensors: device pointers are host addresses
    recs[0].counters, recs[0].workgroups_executed, recs[0].stored

Sanitizer (sanitizer.py): `options(sanitize=True)` turns on missing-wait, MFMA-hazard, LDS-race and
inactive-lane (a v_readlane of a lane the last write skipped) detection and seeded wave interleaving;
`guard(inputs)` adds memory checking (out-of-bounds and uninitialized reads) against the tensors the block
receives and creates. Reports raise SanitizerReport (a LaunchError).

install() loads a substitute libamdhip64.so.7 (hip_shim.c) with RTLD_GLOBAL, so FlyDSL's JIT runtime binds
to it; module loads and launches then come to runtime.py, which decodes the code object with llvm-objdump-22
and executes it instruction by instruction. Neither the kernels nor FlyDSL know they are emulated.
"""

from __future__ import annotations

import contextlib
import os

from . import runtime, shim
from .engine import LaunchError, LaunchRecord, SanitizerReport
from .translate import UnknownInstruction

__all__ = ["install", "available", "wanted", "launches", "options", "guard", "LaunchRecord", "LaunchError",
           "SanitizerReport", "UnknownInstruction", "installed"]

_KEEP = object()

_installed = False


def available() -> bool:
    """True when the emulator can be installed in this process (FlyDSL's runtime not yet bound elsewhere)."""
    if _installed:
        return True
    return not shim.fly_runtime_loaded()


def installed() -> bool:
    return _installed


def _patch_flydsl_error_path() -> None:
    """Raise a failed emulated launch's exception in the caller once FlyDSL's compiled host code returns.

    The launch runs inside a ctypes callback nested in FlyDSL's JIT code, where a Python exception cannot
    propagate; FlyDSL only prints the HIP error. We wrap the host entry point FlyDSL calls.
    """
    from flydsl.compiler import jit_executor

    art = jit_executor.CompiledArtifact
    if getattr(art, "_emulator_patched", False):
        return
    original = art._get_func_exe

    def _get_func_exe(self):
        fn = original(self)
        if getattr(fn, "_emulator_wrapped", False):
            return fn

        def call(packed):
            runtime._pending_error.clear()
            result = fn(packed)
            runtime.raise_pending()
            return result
        call._emulator_wrapped = True
        self._func_exe = call
        return call

    art._get_func_exe = _get_func_exe
    art._emulator_patched = True


def install() -> None:
    """Build/load the HIP shim before FlyDSL's runtime, register callbacks, target gfx950, and run torch's
    host ops on one thread (unless OMP_NUM_THREADS says otherwise). Idempotent."""
    global _installed
    if _installed:
        return
    from harness.toolchain import configure_gfx950

    configure_gfx950()
    shim.load()
    shim.register(runtime.load_module, runtime.get_function, runtime.launch, runtime.unload)
    bin_dir = str(shim.bin_dir())
    if bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    _patch_flydsl_error_path()
    # Emulated work runs in parallel as processes (pytest-xdist workers, `harness run --jobs`, the ranks), so
    # torch's intra-op threads only contend with them: the OpenMP team spins for a core another process holds.
    # One TP8 MoE case beside a busy core: 34 -> 15 CPU-s with one thread. OMP_NUM_THREADS, when set, decides.
    if not os.environ.get("OMP_NUM_THREADS"):
        import torch

        torch.set_num_threads(1)
    _installed = True


@contextlib.contextmanager
def launches():
    """Record a LaunchRecord for every emulated launch inside the block (yields the list)."""
    recs: list[LaunchRecord] = []
    runtime._recorders.append(recs)
    try:
        yield recs
    finally:
        runtime._recorders.remove(recs)


@contextlib.contextmanager
def options(workgroup_order_seed=None, workgroup_sample=None, sample_seed=0, execute=True, sanitize=_KEEP,
            interleave_seed=_KEEP, memory=_KEEP, workgroup_filter=None, lockstep=_KEEP, workgroup_also=()):
    """Launch options for the block: a seeded workgroup order, and/or a seeded sample of N workgroups
    (the LaunchRecord lists the executed workgroup ids so callers check only those tiles) plus the (x, y, z)
    ids in `workgroup_also` that the grid holds; execute=False takes every launch through FlyDSL and the HIP
    substitute but runs no kernel code.

    workgroup_filter(kernel_name, grid, pointers, read) -> set of (x, y, z) ids, or None for all: chooses
    the workgroups of each launch from the launch itself; `pointers` are its global-buffer arguments in
    order (one per tensor) and read(address, nbytes) -> bytes reads memory the earlier launches wrote.

    sanitize: True (every detector) or a set of 'waits', 'hazards', 'races', 'interleave', 'lanes'; interleave_seed
    seeds the wave interleaving (default: the workgroup order seed); memory: a guard() (usually set by it).
    lockstep: False runs every wave alone (engine.LOCKSTEP, on unless AMD_KERNELS_EMULATOR_LOCKSTEP=0, is
    the default); the results, counters and reports are the same either way.
    These four are inherited from an enclosing options() block unless given."""
    opts = dict(runtime.current_options())
    opts.update(workgroup_order_seed=workgroup_order_seed, workgroup_sample=workgroup_sample,
                sample_seed=sample_seed, execute=execute, workgroup_filter=workgroup_filter,
                workgroup_also=tuple(tuple(int(v) for v in i) for i in workgroup_also))
    for key, value in (("sanitize", sanitize), ("interleave_seed", interleave_seed), ("memory", memory),
                       ("lockstep", lockstep)):
        if value is not _KEEP:
            opts[key] = value
    runtime._options_stack.append(opts)
    try:
        yield opts
    finally:
        runtime._options_stack.pop()


@contextlib.contextmanager
def guard(roots=()):
    """Memory checking for launches in the block: only the tensors in `roots` (any nesting of
    dicts/lists/tuples) and those created inside the block are reachable; fresh ones are poisoned."""
    from .memguard import MemoryGuard

    g = MemoryGuard(roots)
    opts = dict(runtime.current_options())
    opts["memory"] = g
    runtime._options_stack.append(opts)
    try:
        with g:
            yield g
    finally:
        runtime._options_stack.pop()
