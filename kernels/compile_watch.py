"""Report FlyDSL compiles that happen while serving.

Every trace of a `@flyc.jit` function (a compile, or at best a ~0.2 ms cache-key build plus a disk-cache
load) is recorded. Compiles inside a warm-up are expected. Once a caller's warm-up has finished (an
entry's `warm_up()`), serving has begun, and from then on
- any compile outside a warm-up is reported with its call site (the first frame outside amd_kernels and
  flydsl) and what changed in the compile key against the nearest key that function compiled before;
- a lazy warm-up (the first call of an entry in a mode no warm_up() covered, which loads or compiles that
  mode's variants in the serving path) is reported once, with the call site of that call.
A first call before any warm_up() warms its mode silently: that is how a caller that never warms works.
With AMD_KERNELS_COMPILE_ERROR=1 a report is raised as CompileWhileServingError instead of warned (the
harness runs that way).
"""

from __future__ import annotations

import contextlib
import os
import threading
import traceback
import warnings
from dataclasses import dataclass, field

ERROR_ENV = "AMD_KERNELS_COMPILE_ERROR"


class CompileWhileServing(RuntimeWarning):
    """A FlyDSL compile happened outside every warm-up, after a warm-up had run."""


class CompileWhileServingError(RuntimeError):
    pass


@dataclass
class CompileEvent:
    function: str
    key: dict  # argument name -> summary of what the compile key sees of it
    call_site: str  # "file:line in function" of the first frame outside amd_kernels and flydsl
    during_warm_up: bool
    changed: list = field(default_factory=list)  # "arg: old -> new" against the nearest earlier key

    def describe(self) -> str:
        why = "; ".join(self.changed) if self.changed else "first compile of this function in this process"
        return f"FlyDSL compile of {self.function} at {self.call_site} ({why})"


_lock = threading.RLock()
_state = threading.local()
_events: list[CompileEvent] = []
_keys_seen: dict[str, list[dict]] = {}
_armed = False  # becomes True when the first warm-up finishes
_installed = False


def _summarize(value) -> str:
    try:
        import torch

        if isinstance(value, torch.Tensor):
            return f"Tensor[{value.dtype}, rank {value.dim()}]"
    except ImportError:  # pragma: no cover - torch is always present where kernels run
        pass
    if isinstance(value, (bool, int, float, str)) or value is None:
        return repr(value)
    return type(value).__name__


_OUR_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
# Frames that only carry the call into a kernel: FlyDSL itself and torch's custom-op dispatch.
_PASS_THROUGH = (f"{os.sep}flydsl{os.sep}", f"{os.sep}torch{os.sep}_ops.py", f"{os.sep}torch{os.sep}_library{os.sep}")


def _call_site() -> str:
    for frame in reversed(traceback.extract_stack()):
        path = os.path.abspath(frame.filename)
        if path.startswith(_OUR_DIR) or any(p in path for p in _PASS_THROUGH):
            continue
        return f"{frame.filename}:{frame.lineno} in {frame.name}"
    return "<unknown>"


def _diff(old: dict, new: dict) -> list[str]:
    names = list(dict.fromkeys([*old, *new]))
    return [f"{n}: {old.get(n, '<absent>')} -> {new.get(n, '<absent>')}" for n in names if old.get(n) != new.get(n)]


def _record(function: str, key: dict) -> CompileEvent:
    with _lock:
        during = in_warm_up()
        event = CompileEvent(function, key, _call_site(), during)
        earlier = _keys_seen.setdefault(function, [])
        if earlier:
            event.changed = min((_diff(k, key) for k in earlier), key=len)
            if not event.changed:
                event.changed = ["same key: a plain @flyc.jit call instead of the compiled function"]
        earlier.append(key)
        _events.append(event)
    if _armed and not during:
        _report(event)
    return event


def _report(event: CompileEvent) -> None:
    if os.environ.get(ERROR_ENV, "") not in ("", "0"):
        raise CompileWhileServingError(event.describe())
    warnings.warn(event.describe(), CompileWhileServing, stacklevel=3)


def lazy_warm_up(what: str) -> None:
    """A call is about to warm `what` (an entry and its mode) on first use. After a caller's warm-up that
    loads or compiles variants in the serving path: record it and report it with the call's site."""
    if not _armed or in_warm_up():
        return
    event = CompileEvent(what, {}, _call_site(), False,
                         ["a lazy warm-up: the first call in a mode no warm_up() covered; warm it at load time"])
    with _lock:
        _events.append(event)
    _report(event)


def install() -> None:
    """Wrap FlyDSL's JIT entry point once per process so every trace is recorded."""
    global _installed
    with _lock:
        if _installed:
            return
        from flydsl.compiler import jit_function

        original = jit_function.JitFunction._compile_or_execute

        def watched(self, args, kwargs, *, execute, return_compiled=False):
            from flydsl._mlir import ir

            if ir.Context.current is None:  # an outer launch, not a nested trace
                try:
                    _, plain_args = self._split_self(args)  # resolves self._sig on a first call
                    bound = self._sig.bind(*plain_args, **kwargs)
                    key = {name: _summarize(v) for name, v in bound.arguments.items()}
                except (TypeError, AttributeError):
                    key = {"args": f"{len(args)} positional"}
                _record(getattr(self.func, "__qualname__", repr(self.func)), key)
            return original(self, args, kwargs, execute=execute, return_compiled=return_compiled)

        jit_function.JitFunction._compile_or_execute = watched
        _installed = True


def in_warm_up() -> bool:
    return getattr(_state, "depth", 0) > 0


@contextlib.contextmanager
def warming(arm: bool = True):
    """Compiles inside this block are part of a warm-up; leaving a caller's warm-up (`arm`) arms the report.
    A lazy warm-up (arm=False) does not: it is the first call of a caller that may never warm."""
    global _armed
    install()
    _state.depth = getattr(_state, "depth", 0) + 1
    try:
        yield
    finally:
        _state.depth -= 1
        if _state.depth == 0 and arm:
            _armed = True


def armed() -> bool:
    """Whether a caller's warm-up has finished in this process (so serving has begun)."""
    return _armed


def disarm() -> None:
    """Forget that a warm-up finished: a new serving session starts (the harness starts each test so)."""
    global _armed
    _armed = False


@contextlib.contextmanager
def recording():
    """Collect the compile events of a block: `with recording() as events: ...`."""
    install()
    with _lock:
        start = len(_events)
    collected: list[CompileEvent] = []
    try:
        yield collected
    finally:
        with _lock:
            collected.extend(_events[start:])


def serving_compiles(events) -> list[CompileEvent]:
    return [e for e in events if not e.during_warm_up]
