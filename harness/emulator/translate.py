"""Turn a kernel's disassembled instructions into a PC-indexed table of handlers, once per code object.

An instruction with no semantics becomes a handler that raises UnknownInstruction when it executes (so a
kernel that never reaches it still runs, and one that does stops with the mnemonic and PC).
"""

from __future__ import annotations

from dataclasses import dataclass

from . import ops_matrix, ops_memory, ops_scalar, ops_vector


class UnknownInstruction(RuntimeError):
    pass


def instruction_class(mnemonic: str) -> str:
    m = mnemonic
    if m.startswith(("v_mfma", "v_smfmac")):
        return "mfma"
    if m.startswith(("s_load", "s_buffer_load", "s_store", "s_dcache", "s_memtime", "s_memrealtime")):
        return "smem"
    if m.startswith(("s_branch", "s_cbranch", "s_setpc", "s_swappc")):
        return "branch"
    if m.startswith("s_waitcnt"):
        return "waitcnt"
    if m == "s_barrier":
        return "barrier"
    if m in ("s_nop", "s_setprio", "s_sleep", "s_sched_barrier", "s_endpgm") or m.startswith("s_"):
        return "salu" if m not in ("s_nop", "s_setprio", "s_sleep", "s_sched_barrier", "s_endpgm") else "control"
    if m.startswith(("buffer_", "global_", "flat_", "scratch_")):
        return "vmem"
    if m.startswith("ds_"):
        return "lds"
    if m.startswith(("v_cmp_", "v_cmpx_")):
        return "vopc"
    if m.startswith("v_"):
        return "valu"
    return "other"


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


def build(inst, ctx):
    m = inst.mnemonic
    if m.startswith(("v_mfma", "v_smfmac")):
        return ops_matrix.build_mfma(inst, ctx)
    if m.startswith("s_"):
        if m.startswith(("s_load", "s_buffer_load", "s_dcache", "s_memtime", "s_memrealtime")):
            return ops_scalar.build_smem(inst, ctx)
        if m.startswith(("s_getreg", "s_setreg")):
            return ops_scalar.build_hwreg(inst, ctx)
        h = ops_scalar.build_sopp(inst, ctx)
        if h is None:
            h = ops_scalar.build_salu(inst, ctx)
        return h
    if m.startswith(("global_", "flat_")):
        return ops_memory.build_global(inst, ctx)
    if m.startswith("buffer_"):
        return ops_memory.build_buffer(inst, ctx)
    if m.startswith("ds_"):
        return ops_memory.build_ds(inst, ctx)
    if m.startswith("v_"):
        base, _ = ops_vector.split_encoding(m)
        if base in ops_vector.OPS or base in ops_vector.SPECIAL:
            return ops_vector.build_valu(inst, ctx)
        h = ops_matrix.build_cvt(inst, ctx) if base.startswith("v_cvt") else None
        return h if h is not None else ops_vector.build_valu(inst, ctx)
    return None


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
        self.table = [(_bad_pc(text_addr + 4 * i), 0) for i in range(n)]
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
            self.classes[i] = instruction_class(inst.mnemonic)
