"""Turn a kernel's disassembled instructions into a PC-indexed table of handlers, once per code object
(dispatch.py says which builder makes each handler).

An instruction with no semantics becomes a handler that raises UnknownInstruction when it executes (so a
kernel that never reaches it still runs, and one that does stops with the mnemonic and PC).
"""

from __future__ import annotations

import contextlib
import gc
from dataclasses import dataclass

from .dispatch import build, classify, instruction_class  # noqa: F401 - instruction_class: public


class UnknownInstruction(RuntimeError):
    pass


@dataclass
class Context:
    acc_offset: int
    counters: object          # a Counters-like sink; launches swap in their own (see CounterProxy)
    load_bias: int = 0        # added to PCs for s_getpc (code object loaded at address 0 here)


class CounterProxy:
    """Stable object handlers capture; forwards to the current launch's Counters."""

    def __init__(self):
        object.__setattr__(self, "_target", None)

    def bind(self, target):
        object.__setattr__(self, "_target", target)

    def __getattr__(self, name):
        return getattr(self._target, name)

    def __setattr__(self, name, value):
        setattr(self._target, name, value)


@contextlib.contextmanager
def gc_paused():
    """The cyclic collector off while a program is made: translation makes millions of long-lived objects
    (closures, cells, operands), none of them garbage, and each full collection they trigger rescans all of
    them (on the MoE entry 5x the translation's own work). Back on afterwards, it scans them as it would
    any new objects."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _unknown(inst, why=""):
    msg = f"unsupported instruction {inst.mnemonic!r} at pc {inst.pc:#x}: {inst.text}" + (f" ({why})" if why else "")

    def h(w):
        raise UnknownInstruction(msg)
    return h


def _bad_pc(pc):
    def h(w):
        raise RuntimeError(f"jump to pc {pc:#x}, which is not the start of an instruction")
    return h


class Program:
    """Handlers for one code object's .text, indexed by (pc - base) // 4."""

    def __init__(self, insts, ctx: Context, text_addr: int, text_size: int):
        self.base = text_addr
        n = (text_size + 3) // 4
        self.table = [None] * n
        self.classes = ["other"] * n
        self.insts = {}
        self.unknown = {}
        for inst in insts:
            i = (inst.pc - text_addr) >> 2
            self.insts[inst.pc] = inst
            try:
                h = build(inst, ctx)
                why = ""
            except NotImplementedError as e:
                h, why = None, str(e)
            except Exception as e:  # noqa: BLE001 - a malformed operand is an unsupported instruction
                h, why = None, f"{type(e).__name__}: {e}"
            if h is None:
                self.unknown[inst.pc] = inst.mnemonic
                h = _unknown(inst, why)
            self.table[i] = (h, inst.pc + inst.size)
            self.classes[i] = classify(inst.mnemonic).klass
        for i, entry in enumerate(self.table):     # the words inside an instruction, or past the last
            if entry is None:
                self.table[i] = (_bad_pc(text_addr + 4 * i), 0)
