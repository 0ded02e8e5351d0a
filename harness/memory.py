"""The test process's memory: its peak resident set per test, and releasing the references' cached inputs.

The whole suite runs in two xdist workers on a 24 GiB machine. The MoE builder's checkpoint is regenerated
expert by expert where it is used (references.moe.LazyExperts; the routed MoE's builder holds the same lazy
tensors), so a TP1 MoE case holds only its prepared weights (1.7 GB, kept for the package's next case, `moe`
or `routed`: preparing costs ~20 s) and peaks at ~2.9-3.4 GiB in a whole-suite worker (ci13; 5.08 GiB in
ci10, before the collection after each test and the case's lighter runs below).
conftest.py resets the peak before each test, fails a test whose peak (VmHWM, this process only: xdist
workers and a plain run alike) passes the limit, and between tests: where the next test takes other inputs,
releases the caches (the references' lru_caches, the paged attention's split workspaces through the packages'
release_workspaces()) and, when a cache held something, collects every reference cycle; otherwise, and where it
shares them, it collects the cycles made since (settle(); the long-lived objects are frozen, so this walk is
cheap). A full walk after every test cost 0.6 s at 0.7 M objects and ~5 s late in a suite run (ci35: a
docstring test took 5-6 CPU-s, ~250 tests 3-8 s), paid by every test whose successor takes other inputs.
A test's peak includes what earlier tests left resident in the process (compiled kernels, the emulator's translations and decoded code, freed but
resident heap), which is why the limit stays above the 4 GiB goal. The decoder layer's weights
(references.layer.build_layer_weights) hold the same lazy experts, so a TP1 layer chain holds the MoE's prepared
weights, not the checkpoint beside them (the decode chain of harness/test_layer.py peaks at ~2.6 GiB; ~4.1 GiB
with the eager checkpoint).

What a worker kept and what a case holds (peak log, one process, `-n 0`, lists in .cache/mem5_*):
- The emulator leaves each launch's waves in reference cycles (Wave, WaveSan, _Workgroup, LdsShadow: ~3,500
  objects after a gemm case at one token, whose collection freed 0.06 GiB of RSS) that Python's collector
  reaches only when the objects made since its last full pass number a quarter of all (0.4 M objects in a
  test process: a full pass takes 0.6-1.4 s here); a worker so carried up to ~0.05 GiB more per test
  through a shape's tests (2.08 -> 3.00 GiB over the h6144 norms of ci11). conftest collects after each
  test: gemm n2880_k512 at 1, 8, 16 tokens then peaked 0.56, 0.61, 0.66 GiB before, 0.57 each after.
- A case (harness/checks.py Case.check) compares its runs as they finish and keeps one run's outputs,
  runs on the clean inputs when there are no padding rows, computes the reference of a sampled
  `rows_independent` op on the compared rows only (the same bytes: reference(rows) == reference(all)[rows],
  checked for every such op at 8192 tokens) and drops each fp32 copy once compared: fused_add_rmsnorm_mxfp8
  h6144 at 8192 tokens peaked 2.66 GiB before, 1.14 after; rmsnorm h6144 1.97 -> 0.85; quant k4096 1.28 ->
  0.78; gemm n2880_k512 1.45 -> 1.22 (same cosines to the last bit, same elements and rows checked).
- The paged attention's workspace (264 MiB at 64 query heads, 132 at 8) is resident after an emulated
  run and stayed for the rest of the worker; it now goes between shapes (the tests after the attention ones
  in a sample of a worker's order: ~1.0 -> ~0.6 GiB).
- test_unprepared_weights handed the MoE entry the lazy checkpoint w13, which the dispatch drew whole (1.06
  GB at i2880) before the shape check rejected it; it now passes a never-written plain tensor of that shape:
  3.12 -> 2.12 GiB in a fresh process.
Not reduced yet: the TP1 MoE numerics cases (i2880), which hold their 1.7 GB of prepared weights and more.

AMD_KERNELS_TEST_PEAK_LOG=<file> (off by default) appends "<test id> <pid> <peak KiB> <wall s> <CPU s>" per test
that ran (setup to teardown; the CPU of this process and of the child processes it waited for, e.g. the 8 ranks of a
multi-rank test): the per-test peaks and costs of a whole run. `/usr/bin/time -v` cannot give them: its "Maximum
resident set size" is each process's peak since its last reset, so for a test process only the last test's.
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import os
import pkgutil
import resource
import sys
import time

LIMIT_ENV = "AMD_KERNELS_TEST_RSS_LIMIT_MIB"
PEAK_LOG_ENV = "AMD_KERNELS_TEST_PEAK_LOG"  # a file path: each test that ran appends a line (log_peak)
# Every test of a whole-suite run (two xdist workers) now peaks below the 4096 goal: 3.74 GiB at most (ci13,
# test_references' MoE builder seeding; the TP1 MoE cases 2.9-3.4 GiB). The limit keeps ~1.3 GiB above that,
# because which tests share a worker varies by run; before this stop's memory work ci10 peaked at 5.08 GiB.
DEFAULT_LIMIT_MIB = 5120


def limit_mib() -> int:
    """The per-test peak RSS limit in MiB (AMD_KERNELS_TEST_RSS_LIMIT_MIB; 0 turns the check off)."""
    raw = os.environ.get(LIMIT_ENV, "")
    if raw == "":
        return DEFAULT_LIMIT_MIB
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{LIMIT_ENV}={raw!r}: expected a whole number of MiB (0: no limit)") from None
    if value < 0:
        raise ValueError(f"{LIMIT_ENV}={raw!r}: expected a whole number of MiB (0: no limit)")
    return value


def clock() -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process, of its waited-for children and of the emulated rank
    processes it started, which a fork server forks) now."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    ranks = sys.modules.get("harness.emulator.ranks")
    rank_cpu = ranks.ranks_cpu_seconds() if ranks is not None else 0.0
    return time.perf_counter(), own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime + rank_cpu


def log_peak(nodeid: str, peak_kib: int, since: tuple[float, float] | None = None) -> None:
    """Append a test's peak to the file AMD_KERNELS_TEST_PEAK_LOG names (unset: nothing), one line per test:
    "<nodeid> <pid> <peak KiB> <wall s> <CPU s>", the seconds since `since` (clock() at the test's setup; "-"
    without it). xdist workers append to the same file; a line is one write."""
    path = os.environ.get(PEAK_LOG_ENV, "")
    if path:
        cost = "- -"
        if since is not None:
            wall, cpu = clock()
            cost = f"{wall - since[0]:.2f} {cpu - since[1]:.2f}"
        with open(path, "a") as f:
            f.write(f"{nodeid} {os.getpid()} {peak_kib} {cost}\n")


def status_kib(field: str) -> int:
    """A /proc/self/status field in KiB (VmRSS: resident now, VmHWM: the peak since the last reset)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise LookupError(f"/proc/self/status has no {field}")


def reset_peak() -> bool:
    """Restart VmHWM from the current RSS (Linux: write 5 to /proc/self/clear_refs). False if not allowed:
    VmHWM is then the process's peak so far."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def cached_functions():
    """The references' functools caches (built inputs, checkpoint weights, tables)."""
    import references

    for info in pkgutil.iter_modules(references.__path__):
        module = importlib.import_module(f"references.{info.name}")
        for fn in vars(module).values():
            if callable(getattr(fn, "cache_clear", None)) and hasattr(fn, "__wrapped__"):
                yield fn


def return_freed_memory() -> None:
    """Make glibc hand freed blocks of 1 MiB and more back to the system at once (mmap'd, not kept in the
    heap). Its default threshold rises to 32 MiB as big blocks are freed, and an emulated MoE case then
    leaves ~0.7 GB of freed but still resident heap behind, case after case."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    m_trim_threshold, m_mmap_threshold = -1, -3  # glibc mallopt parameters
    libc.mallopt(m_mmap_threshold, 1 << 20)
    libc.mallopt(m_trim_threshold, 8 << 20)


def release_caches() -> bool:
    """Drop the references' cached inputs (the MoE packages' prepared weights go with their checkpoint, by
    reference counting), collect reference cycles, and hand freed heap pages back to the system. True if
    anything was cached.

    The collection matters: a test that catches an error (pytest.raises) keeps it in a cycle (its frame holds
    the ExceptionInfo, whose traceback holds the frame), and with it every tensor of the frames it passed
    through; a TP1 MoE test's 1.7 GB of prepared weights stayed resident so into the next shape's tests."""
    held = [fn for fn in cached_functions() if fn.cache_info().currsize]
    for fn in held:
        fn.cache_clear()
    release_workspaces()
    if not held:
        # Nothing cached was dropped: this test's cycles (the error above among them) are younger than the
        # last freeze, so settle() collects them without walking the frozen objects (0.6 s at 0.7 M of them,
        # ~5 s late in a suite run, paid by every test that shares no inputs with the next).
        settle()
        return False
    gc.unfreeze()
    gc.collect()
    trim()
    gc.freeze()  # what survived (modules, compiled kernels, ...): settle() no longer walks it
    return True


def release_workspaces() -> None:
    """Call every imported kernel package's `release_workspaces()` (the paged attention's split workspace: 264 MiB
    for 64 query heads, 132 MiB for 8, all resident after an emulated run), so they stay only while their
    shape's tests run."""
    for name, module in list(sys.modules.items()):
        release = vars(module).get("release_workspaces") if name.startswith("amd_kernels.") and module else None
        if callable(release):
            release()


def settle() -> None:
    """Between tests that share cached inputs: collect the reference cycles made since the last freeze (cheap:
    the ~0.4 M long-lived objects are frozen, whose full walk takes 0.6-1.4 s here), freeze what survived, and
    trim.

    The emulator leaves each launch's waves and workgroups in reference cycles, with their registers. Python's
    automatic full collection waits until the objects surviving since the last one number a quarter of all,
    so without this a test worker kept them for many tests (see the module docstring)."""
    gc.collect()
    gc.freeze()
    trim()


def trim() -> None:
    """Return the free pages inside glibc's heap to the system (an emulated MoE run leaves ~0.3-0.7 GB of
    them: small blocks freed between live ones, which no threshold releases)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
