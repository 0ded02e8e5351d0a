"""Compile every variant an entry can hit before it serves.

A kernel package lists its FlyDSL specializations in a `VariantTable` (key -> launcher and a function
that builds example arguments) and decorates each public entry with `entry(table, modes, mode_of)`.
On the first call of each mode (e.g. the decode tier or the prefill tier) the entry:
1. probes the disk cache for every variant of the mode (FLYDSL_RUNTIME_RUN_ONLY makes a miss raise; an
   artifact that does not match its key counts as a miss, see jit_cache.py),
2. compiles the misses in worker processes (FlyDSL's disk cache is safe to share between processes),
   with a progress bar,
3. loads every variant of the mode in this process as a `flyc.compile` CompiledFunction (~5 us a call,
   against ~220 us for a plain `@flyc.jit` call), then launches.
All of that runs inside compile_watch.warming(), so only compiles outside a warm-up are reported; and once a
caller has run a `warm_up()`, a first call in a mode it did not warm is reported as a lazy warm-up.
"""

from __future__ import annotations

import atexit
import functools
import importlib
import importlib.util
import json
import os
import queue
import subprocess
import sys
import threading
import time
import traceback
import warnings
from dataclasses import dataclass
from typing import Callable

import torch

from amd_kernels import compile_watch, jit_cache, llvm_state

# vLLM's largest CUDA-graph capture size: batches of up to this many tokens run an entry's "decode" mode
# (its decode tiers), larger ones its "prefill" mode.
DECODE_MAX_TOKENS = 512
WORKERS_ENV = "AMD_KERNELS_COMPILE_WORKERS"
_RUN_ONLY_ENV = "FLYDSL_RUNTIME_RUN_ONLY"
_warm_lock = threading.RLock()


@dataclass(frozen=True)
class Variant:
    launcher: Callable  # a @flyc.jit function
    example_args: Callable[[], tuple]  # () -> the full positional arguments that select this specialization


class VariantTable:
    """The specializations of one kernel package and the compiled functions loaded in this process."""

    def __init__(self, module: str, variants: dict[str, Variant]):
        self.module = module  # importable name of the module that defines this table as VARIANTS
        self.variants = variants
        self._loaded: dict[str, Callable] = {}

    def __getitem__(self, key: str) -> Callable:
        """The compiled function of `key`; compiling here (outside a warm-up) is reported by compile_watch."""
        fn = self._loaded.get(key)
        if fn is None:
            with _warm_lock:  # _load sets FLYDSL_RUNTIME_RUN_ONLY for the process; the pool is shared
                if llvm_state.changed():  # this process's LLVM options are not LLVM's own: a worker compiles
                    fn = self._load(key)
                    if fn is None:
                        _compile_in_workers(self, [key], key)
                        fn = self._load(key)
                fn = fn or self._compile(key)
                self._loaded[key] = fn
        return fn

    def is_loaded(self, key: str) -> bool:
        return key in self._loaded

    def _compile(self, key: str, load_only: bool = False) -> Callable:
        """Compile `key` in this process (`load_only`: _load's disk-cache load, which writes nothing)."""
        import flydsl.compiler as flyc

        jit_cache.install()  # disk-cache artifacts are checked against their keys before use
        llvm_state.install()
        variant = self.variants[key]
        if load_only or not llvm_state.changed():
            return flyc.compile(variant.launcher, *variant.example_args())
        # Reached only when no worker could compile it (they died, or the table is not importable by name).
        warnings.warn(f"{self.module}:{key} compiled in a process where another compile set LLVM options "
                      "(amd_kernels/llvm_state.py): its code object may differ from a clean process's, so it is "
                      "not written to the disk cache", llvm_state.LLVMOptionsChanged, stacklevel=3)
        with jit_cache.not_stored():
            return flyc.compile(variant.launcher, *variant.example_args())

    def _load(self, key: str) -> Callable | None:
        """`key` from the disk cache, or None on a miss (an artifact that does not match its key is one)."""
        previous = os.environ.get(_RUN_ONLY_ENV)
        os.environ[_RUN_ONLY_ENV] = "1"
        try:
            return self._compile(key, load_only=True)
        except RuntimeError as err:
            if "RUN_ONLY" not in str(err):
                raise
            return None
        finally:
            if previous is None:
                os.environ.pop(_RUN_ONLY_ENV, None)
            else:
                os.environ[_RUN_ONLY_ENV] = previous

    def warm(self, keys: list[str], label: str, arm: bool = True) -> dict:
        """Load `keys` into this process, compiling misses in workers. Returns timings for reports.
        `arm`: a caller's warm-up (serving begins after it), not a lazy one on a first call."""
        compile_watch.install()
        with _warm_lock, compile_watch.warming(arm):
            start = time.perf_counter()
            misses = []
            for key in (k for k in keys if k not in self._loaded):
                fn = self._load(key)
                if fn is None:
                    misses.append(key)
                else:
                    self._loaded[key] = fn
            if misses:
                _compile_in_workers(self, misses, label)
                for key in _progress(misses, f"{label}: loading"):
                    self._loaded[key] = self._load(key) or self._compile(key)
            return {"variants": len(keys), "compiled": len(misses), "seconds": time.perf_counter() - start}


def _progress(items, desc: str, total: int | None = None):
    """A tqdm bar over `items` on a terminal; `items` itself (or None with items=None) otherwise."""
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm is optional at run time
        return items
    return tqdm(items, desc=desc, total=total, unit="variant", leave=False, disable=not sys.stderr.isatty())


class _CompilePool:
    """Long-lived compile workers: fresh interpreters (never a fork of the caller, whose __main__ may be
    unguarded), each paying the torch + FlyDSL import (~3.5 s) once per process, not once per entry."""

    def __init__(self, size: int):
        self._env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        self._procs = [self._spawn() for _ in range(size)]
        atexit.register(self.close)

    def _spawn(self) -> subprocess.Popen:
        script = "from amd_kernels.warm_up import _worker_loop; _worker_loop()"
        return subprocess.Popen([sys.executable, "-c", script], env=self._env, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)

    def compile(self, module: str, keys: list[str], label: str) -> None:
        jobs: queue.Queue = queue.Queue()
        for key in keys:
            jobs.put(key)
        bar = _progress(None, f"{label}: compiling", total=len(keys))
        errors: list[str] = []
        lost: list[str] = []  # keys whose worker died under them

        def serve(proc):
            while not errors:
                try:
                    key = jobs.get_nowait()
                except queue.Empty:
                    return
                try:
                    proc.stdin.write(json.dumps({"module": module, "key": key}) + "\n")
                    proc.stdin.flush()
                    line = proc.stdout.readline()
                except OSError:  # the pipe of a worker that already died
                    line = ""
                if not line:  # the worker died (seen: a native crash inside the compiler): stop using it
                    lost.append(key)
                    return
                reply = json.loads(line)
                if "error" in reply:
                    errors.append(f"{key}: {reply['error']}")
                elif bar is not None:
                    bar.update(1)

        threads = [threading.Thread(target=serve, args=(p,)) for p in self._procs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if bar is not None:
            bar.close()
        if errors:
            raise RuntimeError(f"{label}: compile failed: {errors[0]}")
        # Dead workers are replaced; what they (or, when all died, nobody) compiled is compiled here, so a
        # worker's crash costs time, never a failed warm-up (a compile error still fails, above).
        dead = [p.returncode for p in self._procs if p.poll() is not None]
        if dead:  # said, not hidden: a native crash in the compiler is a bug to report (FlyDSL's or ours)
            warnings.warn(f"{label}: {len(dead)} compile worker(s) died (exit {', '.join(map(str, dead))}) "
                          f"compiling {', '.join(lost) or 'nothing'}; compiling what they left in this process",
                          RuntimeWarning, stacklevel=2)
        self._procs = [p if p.poll() is None else self._spawn() for p in self._procs]
        while not jobs.empty():
            lost.append(jobs.get_nowait())
        for key in lost:
            importlib.import_module(module).VARIANTS._compile(key)

    def grow(self, size: int) -> None:
        """At least `size` workers (a pool started for one key grows when a batch comes)."""
        self._procs += [self._spawn() for _ in range(size - len(self._procs))]

    def close(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                proc.stdin.close()
                proc.wait(timeout=30)


_pool: _CompilePool | None = None


def worker_count() -> int:
    """AMD_KERNELS_COMPILE_WORKERS (unset or 0: one worker per CPU)."""
    raw = os.environ.get(WORKERS_ENV, "").strip()
    try:
        size = int(raw) if raw else 0
    except ValueError:
        size = -1
    if size < 0:
        raise ValueError(f"{WORKERS_ENV}: expected the number of compile worker processes (a non-negative "
                         f"integer; 0 or unset means one per CPU), got {raw!r}")
    return size or (os.cpu_count() or 1)


def _compile_in_workers(table: VariantTable, keys: list[str], label: str) -> None:
    """Compile `keys` of `table` into the disk cache: in the worker pool, or here when that is faster (a lone
    miss) and this process's LLVM options are LLVM's own (llvm_state.py)."""
    global _pool
    size = worker_count()
    changed = llvm_state.changed()
    if changed and not _importable(table.module):  # a table no worker can import: compiled here, warned
        for key in keys:
            table._compile(key)
        return
    if _pool is None and (len(keys) == 1 or size <= 1) and not changed:
        # A lone miss compiles faster here than in a worker that still has to import torch and FlyDSL.
        for key in _progress(keys, f"{label}: compiling"):
            table._compile(key)
        return
    if _pool is None:
        _pool = _CompilePool(min(size, len(keys)))
    _pool.grow(min(size, len(keys)))
    _pool.compile(table.module, keys, label)


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # its parent package is not importable either
        return False


def _worker_loop() -> None:
    """A compile worker: one JSON request per line on stdin, one JSON reply per line on stdout."""
    for line in sys.stdin:
        request = json.loads(line)
        start = time.perf_counter()
        try:
            importlib.import_module(request["module"]).VARIANTS._compile(request["key"])
            if llvm_state.changed():  # a worker compiles only our variants, which set no LLVM option
                raise RuntimeError(f"compiling {request['key']} set LLVM options; later compiles in this "
                                   "worker would differ from a clean process's (amd_kernels/llvm_state.py)")
            reply = {"seconds": time.perf_counter() - start}
        except Exception:  # noqa: BLE001 - the traceback goes back to the process that asked
            reply = {"error": traceback.format_exc()[-4000:]}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


def mode_by_tokens(tokens: int) -> str:
    """The mode of a token-row entry: "decode" up to DECODE_MAX_TOKENS tokens, else "prefill"."""
    return "decode" if tokens <= DECODE_MAX_TOKENS else "prefill"


def mode_by_rows(x, *args, **kwargs) -> str:
    """`mode_of` of an entry whose first argument x holds the token rows (mode_by_tokens of its first dim;
    a bad x gets "decode" here and its error from the entry's checks)."""
    return mode_by_tokens(x.shape[0] if isinstance(x, torch.Tensor) and x.dim() else 0)


def entry(table: VariantTable, modes: dict[str, list[str]], mode_of: Callable[..., str]):
    """Decorate a public entry: its first call in each mode warms that mode's variants first.

    `modes` maps a mode name to the variant keys it can hit; `mode_of(*args, **kwargs)` names the mode of
    a call. The decorated function gets `.warm_up(mode=None)` (None warms every mode) and `.modes`.
    """
    unknown = {k for keys in modes.values() for k in keys} - set(table.variants)
    if unknown:
        raise ValueError(f"modes name variants the table does not have: {sorted(unknown)}")

    def decorate(fn):
        warmed: set[str] = set()

        def warm(names: list[str], arm: bool) -> dict:
            names = [n for n in names if n not in warmed]
            if not names:
                if arm:  # a caller's warm_up() begins serving even when every mode is already warm
                    with compile_watch.warming():
                        pass
                return {}
            keys = list(dict.fromkeys(k for n in names for k in modes[n]))
            report = table.warm(keys, f"{fn.__name__} [{', '.join(names)}]", arm)
            warmed.update(names)
            return report

        def warm_up(mode: str | None = None) -> dict:
            """Warm `mode` (None: every mode, in one batch so the workers compile them side by side)."""
            if mode is not None and mode not in modes:
                raise ValueError(f"mode: {fn.__name__} has modes {sorted(modes)}, got {mode!r}")
            return warm(list(modes) if mode is None else [mode], arm=True)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            mode = mode_of(*args, **kwargs)
            if mode not in warmed:
                compile_watch.lazy_warm_up(f"{fn.__name__} [{mode}]")
                warm([mode], arm=False)
            return fn(*args, **kwargs)

        wrapper.warm_up = warm_up
        wrapper.modes = modes
        wrapper.table = table
        return wrapper

    return decorate
