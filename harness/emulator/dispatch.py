"""Instruction dispatch: each mnemonic is classified once into a Kind, and one table maps the Kind's
family to the builder that turns the instruction into a handler.

The Kind also carries the counter class (counters.instructions keys: 'valu', 'vmem', 'lds', ...), so the
builder chosen and the class counted can never disagree. To add an instruction: give it semantics in the
family's builder (often a Row in semantics.py is enough) and, for a new family, one classify rule and one
BUILDERS entry.
"""

from __future__ import annotations

import functools
import re
from typing import NamedTuple

from . import numerics, ops_matrix, ops_memory, ops_scalar, ops_vector
from .semantics import OPS, PK16, PK32


class Kind(NamedTuple):
    family: str       # BUILDERS key
    base: str         # mnemonic without its VALU encoding suffix (_e32, _e64, _dpp, _sdwa)
    enc: str          # '', 'e32', 'e64', 'dpp' or 'sdwa'
    klass: str        # counter class


# Program-control and hint instructions (SOPP); every other s_* that is not scalar memory or a hardware
# register access is SALU.
_SOPP = frozenset((
    "s_nop", "s_waitcnt", "s_setprio", "s_sleep", "s_sched_barrier", "s_icache_inv", "s_incperflevel",
    "s_decperflevel", "s_ttracedata", "s_sethalt", "s_set_gpr_idx_off", "s_waitcnt_vscnt", "s_waitcnt_vmcnt",
    "s_waitcnt_lgkmcnt", "s_waitcnt_expcnt", "s_dcache_wb_vol", "s_dcache_inv_vol", "s_wakeup",
    "s_denorm_mode", "s_round_mode", "s_sendmsg", "s_sendmsghalt", "s_endpgm", "s_barrier", "s_branch",
    "s_cbranch_scc0", "s_cbranch_scc1", "s_cbranch_vccz", "s_cbranch_vccnz", "s_cbranch_execz",
    "s_cbranch_execnz", "s_trap"))
_CONTROL = frozenset(("s_nop", "s_setprio", "s_sleep", "s_sched_barrier", "s_endpgm"))
_DS_READ_TR = re.compile(r"ds_read_b64_tr_b(4|8|16)$")
_DS_PAIR = re.compile(r"ds_(read2|write2)(st64)?_b(32|64)$")
_DS_RW = re.compile(r"ds_(read|write)_(\w+)$")


def _scalar_class(m: str) -> str:
    if m.startswith(("s_load", "s_buffer_load", "s_store", "s_dcache", "s_memtime", "s_memrealtime")):
        return "smem"
    if m.startswith(("s_branch", "s_cbranch", "s_setpc", "s_swappc")):
        return "branch"
    if m.startswith("s_waitcnt"):
        return "waitcnt"
    if m == "s_barrier":
        return "barrier"
    return "control" if m in _CONTROL else "salu"


def _ds_family(m: str) -> str:
    if m == "ds_nop":
        return "ds_nop"
    if m == "ds_swizzle_b32":
        return "ds_swizzle"
    if m in ("ds_bpermute_b32", "ds_permute_b32"):
        return "ds_permute"
    if _DS_READ_TR.match(m):
        return "ds_read_tr"
    if _DS_PAIR.match(m):
        return "ds_pair"
    rw = _DS_RW.match(m)
    if rw and rw.group(2) in ops_memory.SIZES:
        return "ds_rw"
    return "ds_atomic"


def _vector_family(base: str, enc: str) -> str:
    if base in ops_vector.SPECIAL:
        return "v_special"
    if base.startswith(("v_cmp_", "v_cmpx_")):
        return "vopc"
    if base in PK16:
        return "v_pk16"
    if base in PK32:
        return "v_pk32"
    if base.startswith("v_dot"):
        return "v_dot"
    if base in OPS:
        return "v_op"
    if base == "v_nop":
        return "v_nop"
    if base in numerics.CVT_MNEMONICS and enc != "dpp":
        return "v_cvt"
    return "unknown"


@functools.lru_cache(maxsize=None)
def classify(mnemonic: str) -> Kind:
    m = mnemonic
    if m.startswith(("v_mfma", "v_smfmac")):
        return Kind("mfma", m, "", "mfma")
    if m.startswith("s_"):
        klass = _scalar_class(m)
        if m.startswith(("s_load", "s_buffer_load", "s_memtime", "s_memrealtime")) or m in ("s_dcache_wb",
                                                                                            "s_dcache_inv"):
            return Kind("smem", m, "", klass)
        if m.startswith(("s_getreg", "s_setreg")):
            return Kind("hwreg", m, "", klass)
        return Kind("sopp" if m in _SOPP else "salu", m, "", klass)
    if m.startswith(("global_", "flat_")):
        return Kind("global", m, "", "vmem")
    if m.startswith(("buffer_", "scratch_")):
        return Kind("buffer" if m.startswith("buffer_") else "unknown", m, "", "vmem")
    if m.startswith("ds_"):
        return Kind(_ds_family(m), m, "", "lds")
    if m.startswith("v_"):
        base, enc = ops_vector.split_encoding(m)
        return Kind(_vector_family(base, enc), base, enc, "vopc" if m.startswith(("v_cmp_", "v_cmpx_")) else "valu")
    return Kind("unknown", m, "", "other")


def instruction_class(mnemonic: str) -> str:
    return classify(mnemonic).klass


# family -> builder(inst, ctx, kind) -> handler, or None when the operands are not supported
BUILDERS = {
    "mfma": lambda inst, ctx, k: ops_matrix.build_mfma(inst, ctx),
    "smem": lambda inst, ctx, k: ops_scalar.build_smem(inst, ctx),
    "hwreg": lambda inst, ctx, k: ops_scalar.build_hwreg(inst, ctx),
    "sopp": lambda inst, ctx, k: ops_scalar.build_sopp(inst, ctx),
    "salu": lambda inst, ctx, k: ops_scalar.build_salu(inst, ctx),
    "global": lambda inst, ctx, k: ops_memory.build_global(inst, ctx),
    "buffer": lambda inst, ctx, k: ops_memory.build_buffer(inst, ctx),
    "ds_nop": lambda inst, ctx, k: (lambda w: None),
    "ds_swizzle": ops_memory.build_ds_swizzle,
    "ds_permute": ops_memory.build_ds_permute,
    "ds_read_tr": ops_memory.build_ds_read_tr,
    "ds_pair": ops_memory.build_ds_pair,
    "ds_rw": ops_memory.build_ds_rw,
    "ds_atomic": ops_memory.build_ds_atomic,
    "v_special": lambda inst, ctx, k: ops_vector.SPECIAL[k.base](inst, ctx, k.base, k.enc),
    "vopc": lambda inst, ctx, k: ops_vector.build_vopc(inst, ctx, k.base, k.enc),
    "v_pk16": lambda inst, ctx, k: ops_vector.build_pk16(inst, ctx, k.base, k.enc),
    "v_pk32": lambda inst, ctx, k: ops_vector.build_pk32(inst, ctx, k.base, k.enc),
    "v_dot": lambda inst, ctx, k: ops_vector.build_dot(inst, ctx, k.base, k.enc),
    "v_op": lambda inst, ctx, k: ops_vector.build_generic(inst, ctx, k.base, k.enc),
    "v_nop": lambda inst, ctx, k: (lambda w: None),
    "v_cvt": lambda inst, ctx, k: ops_matrix.build_cvt(inst, ctx),
    "unknown": lambda inst, ctx, k: None,
}


def build(inst, ctx):
    """The handler of one instruction, or None when it has no semantics here."""
    kind = classify(inst.mnemonic)
    return BUILDERS[kind.family](inst, ctx, kind)
