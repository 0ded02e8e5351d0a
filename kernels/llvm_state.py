"""Has this process's LLVM had a command-line option set? Then our variants compile in fresh workers.

A FlyDSL kernel compiled with `compile_hints({"llvm_options": ...})` (FlyDSL's own flash attention does so,
and a serving process may compile AITER's or a user's kernels before ours) sets LLVM's process-wide
cl::opt values for its compile and then "restores" them. The restore does not bring an option back to its
unset state: FlyDSL 0.5 reads and writes every optional-value option as a bool, so LLVM's
`lsr-drop-solution` (a cl::boolOrDefault whose unset value defers to the target, true on gfx950) is left
explicitly false after one hinted compile. FlyDSL's cache key names only the compile's own options, so
every later compile in the process, ours included, gives another code object under its usual key, and the
shared disk cache then serves it to every process. Measured (stop 44): under `lsr-drop-solution=false` 24
of our 85 variants compile to other code objects, and one of them (quant_sort's super-tile count, since
fixed) computed nothing.

FlyDSL's setters give back an option's old value, but nothing returns an option to unset, so a process where
one was set never compiles our variants: `changed()` says so, and kernels/warm_up.py then sends every compile
to its worker processes (fresh interpreters that compile only our variants) and only loads artifacts here.
What `changed()` sees: any use of FlyDSL's `llvm_options()` (the compile_hints path), whenever it ran, and a
direct call of FlyDSL's native setters made after `install()` (warm-up's first compile or load installs it).
"""

from __future__ import annotations

import sys
import threading


class LLVMOptionsChanged(RuntimeWarning):
    """One of our variants had to compile in a process whose LLVM options another compile set."""


_SETTERS = ("set_llvm_option_bool", "set_llvm_option_int", "set_llvm_option_str")
_lock = threading.Lock()
_installed = False
_set_seen = False  # a setter ran after install()


def changed() -> bool:
    """True once FlyDSL's llvm_options() ran in this process, or a native setter ran after install()."""
    if _set_seen:
        return True
    # FlyDSL's llvm_options() caches its native module in this global on first use: a hinted compile ran.
    mod = sys.modules.get("flydsl.compiler.llvm_options")
    return mod is not None and getattr(mod, "_fly_module", None) is not None


def install() -> None:
    """Wrap FlyDSL's native option setters so a direct call is seen too (idempotent)."""
    global _installed
    with _lock:
        if _installed:
            return
        from flydsl._mlir._mlir_libs import _mlirDialectsFly as native

        for name in _SETTERS:
            setattr(native, name, _watched(getattr(native, name)))
        _installed = True


def _watched(setter):
    def set_option(*args, **kwargs):
        global _set_seen
        _set_seen = True
        return setter(*args, **kwargs)

    set_option.__name__ = getattr(setter, "__name__", "set_llvm_option")
    return set_option
