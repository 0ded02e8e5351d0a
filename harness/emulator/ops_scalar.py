"""Scalar instructions: SALU (SOP1/SOP2/SOPC/SOPK), program control (SOPP) and scalar memory (SMEM).

Builders take an Inst and the translation context and return a handler `h(wave)`; a handler returns None
to fall through, a PC to branch, or BARRIER/ENDPGM to stop the wave.
"""

from __future__ import annotations

import re

import numpy as np

from .operands import parse_operand, scalar_reader, scalar_writer
from .semantics import M32, M64, SAVEEXEC, SOP1, SOP2, _sx
from .state import EXEC_HI, EXEC_LO, MEM8, MEM_BASE

BARRIER, ENDPGM = -1, -2


def _sop2_handler(name, dst, srcs):
    """Most SOP2 ops: parse 'X_b32'/'X_b64' etc."""
    m = re.match(r"s_(\w+?)_([biu])(32|64)$", name)
    if not m:
        return None
    base, kind, bits = m.group(1), m.group(2), int(m.group(3))
    a, b = scalar_reader(srcs[0], bits), scalar_reader(srcs[1], 32 if base in ("lshl", "lshr", "ashr", "bfe") else bits)
    wr = scalar_writer(dst, bits)
    if base in ("add", "sub", "addc", "subb"):
        carry_in = base in ("addc", "subb")
        if kind == "u":
            if base in ("add", "addc"):
                def h(w):
                    r = a(w) + b(w) + (w.scc if carry_in else 0)
                    wr(w, r)
                    w.scc = int(r > M32)
            else:
                def h(w):
                    r = a(w) - b(w) - (w.scc if carry_in else 0)
                    wr(w, r)
                    w.scc = int(r < 0)
        else:  # signed: scc = overflow
            sign = 1 if base == "add" else -1

            def h(w):
                x, y = _sx(a(w), 32), _sx(b(w), 32)
                r = x + sign * y
                wr(w, r)
                w.scc = int(r != _sx(r, 32))
        return h
    if base in ("min", "max"):
        signed = kind == "i"
        pick = min if base == "min" else max

        def h(w):
            x, y = a(w), b(w)
            xs, ys = (_sx(x, bits), _sx(y, bits)) if signed else (x, y)
            r = pick(xs, ys)
            wr(w, r)
            w.scc = int(r == xs)
        return h
    if base == "cselect":
        def h(w):
            wr(w, a(w) if w.scc else b(w))
        return h
    if base == "bfe":
        base = "bfe_" + kind
    if base == "mul_hi":
        base = f"mul_hi_{kind}32"
    row = SOP2.get(base)
    if row is None:
        return None
    fn = row.fn

    def h(w):
        r, scc = fn(a(w), b(w), bits)
        wr(w, r)
        if scc is not None:
            w.scc = scc
    return h


def build_sop1(inst, ctx):
    name = inst.mnemonic
    ops = [parse_operand(o) for o in inst.operands]
    m = re.match(r"s_(\w+)_saveexec_b64$", name)
    if m and m.group(1) in SAVEEXEC:
        fn = SAVEEXEC[m.group(1)].fn
        src, wr = scalar_reader(ops[1], 64), scalar_writer(ops[0], 64)

        def h(w):
            e = w.s[EXEC_LO] | (w.s[EXEC_HI] << 32)
            s = src(w)
            wr(w, e)
            n = fn(s, e) & M64
            w.s[EXEC_LO], w.s[EXEC_HI] = n & M32, n >> 32
            w.scc = int(n != 0)
        return h
    m = re.match(r"s_(andn1|andn2)_wrexec_b64$", name)
    if m:
        src, wr = scalar_reader(ops[1], 64), scalar_writer(ops[0], 64)
        inv_s = m.group(1) == "andn1"

        def h(w):
            e = w.s[EXEC_LO] | (w.s[EXEC_HI] << 32)
            s = src(w)
            n = ((~s & e) if inv_s else (s & ~e)) & M64
            w.s[EXEC_LO], w.s[EXEC_HI] = n & M32, n >> 32
            wr(w, n)
            w.scc = int(n != 0)
        return h
    if name == "s_getpc_b64":
        wr = scalar_writer(ops[0], 64)
        nxt = inst.pc + inst.size + ctx.load_bias
        return lambda w: wr(w, nxt)
    if name == "s_setpc_b64":
        src = scalar_reader(ops[0], 64)
        return lambda w: src(w) - ctx.load_bias
    if name == "s_swappc_b64":
        wr, src = scalar_writer(ops[0], 64), scalar_reader(ops[1], 64)
        nxt = inst.pc + inst.size + ctx.load_bias

        def h(w):
            target = src(w)
            wr(w, nxt)
            return target - ctx.load_bias
        return h
    if name in ("s_cmov_b32", "s_cmov_b64"):
        bits = 64 if name.endswith("64") else 32
        src, wr = scalar_reader(ops[1], bits), scalar_writer(ops[0], bits)

        def h(w):
            if w.scc:
                wr(w, src(w))
        return h
    if name in ("s_bitset0_b32", "s_bitset1_b32", "s_bitset0_b64", "s_bitset1_b64"):
        bits = 64 if name.endswith("64") else 32
        src, cur, wr = scalar_reader(ops[1], 32), scalar_reader(ops[0], bits), scalar_writer(ops[0], bits)
        one = "bitset1" in name

        def h(w):
            b = 1 << (src(w) & (bits - 1))
            wr(w, (cur(w) | b) if one else (cur(w) & ~b))
        return h
    m = re.match(r"s_(\w+?)_(b32|b64|i32|i64)$", name)
    if not m:
        return None
    base, bits = m.group(1), int(m.group(2)[1:])
    if base in ("bcnt0_i32", "bcnt1_i32", "ff0_i32", "ff1_i32", "flbit_i32"):
        pass
    key = base
    row = SOP1.get(key)
    if row is None and name in ("s_sext_i32_i8", "s_sext_i32_i16"):
        row = SOP1[name[2:]]
    if row is None:
        return None
    fn = row.fn
    srcbits = 64 if name.endswith("_b64") else 32
    src, wr = scalar_reader(ops[1], srcbits), scalar_writer(ops[0], 32 if "_i32" in key else bits)

    def h(w):
        r, scc = fn(src(w), srcbits)
        wr(w, r)
        if scc is not None:
            w.scc = scc
    return h


_CMP = {"eq": lambda a, b: a == b, "lg": lambda a, b: a != b, "gt": lambda a, b: a > b,
        "ge": lambda a, b: a >= b, "lt": lambda a, b: a < b, "le": lambda a, b: a <= b}


def build_sopc(inst, ctx):
    ops = [parse_operand(o) for o in inst.operands]
    m = re.match(r"s_cmpk?_(eq|lg|gt|ge|lt|le)_([iu])(32|64)$", inst.mnemonic)
    if m:
        fn, signed, bits = _CMP[m.group(1)], m.group(2) == "i", int(m.group(3))
        if inst.mnemonic.startswith("s_cmpk") and signed:
            a, b = scalar_reader(ops[0], 32, True), lambda w, c=_sx(int(ops[1].value), 16): c
        else:
            a, b = scalar_reader(ops[0], bits, signed), scalar_reader(ops[1], bits, signed)

        def h(w):
            w.scc = int(fn(a(w), b(w)))
        return h
    m = re.match(r"s_bitcmp([01])_b(32|64)$", inst.mnemonic)
    if m:
        want, bits = int(m.group(1)), int(m.group(2))
        a, b = scalar_reader(ops[0], bits), scalar_reader(ops[1], 32)

        def h(w):
            w.scc = int(((a(w) >> (b(w) & (bits - 1))) & 1) == want)
        return h
    return None


def build_sopk(inst, ctx):
    name = inst.mnemonic
    ops = [parse_operand(o) for o in inst.operands]
    if name == "s_movk_i32":
        wr, c = scalar_writer(ops[0]), _sx(int(ops[1].value), 16) & M32
        return lambda w: wr(w, c)
    if name == "s_cmovk_i32":
        wr, c = scalar_writer(ops[0]), _sx(int(ops[1].value), 16) & M32

        def h(w):
            if w.scc:
                wr(w, c)
        return h
    if name in ("s_addk_i32", "s_mulk_i32"):
        cur, wr, c = scalar_reader(ops[0], 32, True), scalar_writer(ops[0]), _sx(int(ops[1].value), 16)
        if name == "s_addk_i32":
            def h(w):
                r = cur(w) + c
                wr(w, r)
                w.scc = int(r != _sx(r, 32))
        else:
            def h(w):
                wr(w, cur(w) * c)
        return h
    if name.startswith("s_cmpk_"):
        return build_sopc(inst, ctx)
    return None


def build_salu(inst, ctx):
    name = inst.mnemonic
    if name.startswith(("s_cmp_", "s_cmpk_", "s_bitcmp")):
        return build_sopc(inst, ctx)
    if name.startswith(("s_movk", "s_cmovk", "s_addk", "s_mulk")):
        return build_sopk(inst, ctx)
    m = re.match(r"s_lshl([1-4])_add_u32$", name)
    ops = [parse_operand(o) for o in inst.operands]
    if m:
        k = int(m.group(1))
        a, b, wr = scalar_reader(ops[1]), scalar_reader(ops[2]), scalar_writer(ops[0])

        def h(w):
            r = (a(w) << k) + b(w)
            wr(w, r)
            w.scc = int(r > M32)
        return h
    if len(ops) == 3:
        h = _sop2_handler(name, ops[0], ops[1:])
        if h is not None:
            return h
    if len(ops) <= 2:
        return build_sop1(inst, ctx)
    return None


# ---- program control ------------------------------------------------------------------------------

def _branch_target(inst):
    # from the encoding's SIMM16 (the text may print a label instead of the number)
    simm = _sx(inst.words[0] & 0xFFFF, 16)
    return inst.pc + 4 + 4 * simm


def build_sopp(inst, ctx):
    name = inst.mnemonic
    if name == "s_sleep":  # multi-rank hook: yield the CPU, catch hangs (ranks.py)
        from .ranks import build_sleep
        return build_sleep(inst)
    if name in ("s_nop", "s_waitcnt", "s_setprio", "s_sched_barrier", "s_icache_inv",
                "s_incperflevel", "s_decperflevel", "s_ttracedata", "s_sethalt", "s_set_gpr_idx_off",
                "s_waitcnt_vscnt", "s_waitcnt_vmcnt", "s_waitcnt_lgkmcnt", "s_waitcnt_expcnt", "s_dcache_wb",
                "s_dcache_inv", "s_dcache_wb_vol", "s_dcache_inv_vol", "s_wakeup", "s_denorm_mode",
                "s_round_mode", "s_sendmsg", "s_sendmsghalt"):
        # Memory completes immediately in this emulator, so waits and hints have nothing to do.
        return lambda w: None
    if name == "s_endpgm":
        return lambda w: ENDPGM
    if name == "s_barrier":
        return lambda w: BARRIER
    if name == "s_branch":
        t = _branch_target(inst)
        return lambda w: t
    conds = {
        "s_cbranch_scc0": lambda w: w.scc == 0,
        "s_cbranch_scc1": lambda w: w.scc != 0,
        "s_cbranch_vccz": lambda w: (w.s[106] | w.s[107]) == 0,
        "s_cbranch_vccnz": lambda w: (w.s[106] | w.s[107]) != 0,
        "s_cbranch_execz": lambda w: (w.s[EXEC_LO] | w.s[EXEC_HI]) == 0,
        "s_cbranch_execnz": lambda w: (w.s[EXEC_LO] | w.s[EXEC_HI]) != 0,
    }
    if name in conds:
        t, c = _branch_target(inst), conds[name]

        def h(w):
            if c(w):
                return t
        return h
    if name == "s_trap":
        def h(w):
            raise RuntimeError(f"s_trap executed at pc {inst.pc:#x}")
        return h
    return None


# ---- hardware registers ---------------------------------------------------------------------------

_HWREG = {"HW_REG_MODE": 1, "HW_REG_STATUS": 2, "HW_REG_TRAPSTS": 3, "HW_REG_HW_ID": 4, "HW_REG_GPR_ALLOC": 5,
          "HW_REG_LDS_ALLOC": 6, "HW_REG_IB_STS": 7, "HW_REG_SH_MEM_BASES": 15, "HW_REG_XCC_ID": 20}


def _parse_hwreg(text):
    m = re.match(r"hwreg\((\w+)(?:,\s*(\d+),\s*(\d+))?\)", text)
    if not m:
        v = int(text, 0)
        return v & 0x3F, (v >> 6) & 0x1F, ((v >> 11) & 0x1F) + 1
    reg = m.group(1)
    rid = _HWREG.get(reg, int(reg) if reg.isdigit() else None)
    if rid is None:
        raise ValueError(f"unknown hardware register {reg}")
    off, size = (int(m.group(2)), int(m.group(3))) if m.group(2) else (0, 32)
    return rid, off, size


def build_hwreg(inst, ctx):
    if inst.mnemonic == "s_getreg_b32":
        wr = scalar_writer(parse_operand(inst.operands[0]))
        rid, off, size = _parse_hwreg(" ".join(inst.operands[1:]))

        def h(w):
            if rid == 4:    # HW_ID: wave id in [3:0], simd [5:4], cu [11:8]
                val = (w.wave_id & 0xF) | ((w.wave_id & 3) << 4)
            elif rid == 20:  # XCC_ID
                val = 0
            elif rid == 1:
                val = w.launch.mode_reg
            else:
                val = 0
            wr(w, (val >> off) & ((1 << size) - 1))
        return h
    if inst.mnemonic in ("s_setreg_b32", "s_setreg_imm32_b32"):
        # MODE (rounding/denormals) writes are recorded; all others are ignored.
        return lambda w: None
    return None


# ---- scalar memory --------------------------------------------------------------------------------

def build_smem(inst, ctx):
    name = inst.mnemonic
    m = re.match(r"s_(load|buffer_load)_dword(?:x(\d+))?$", name)
    if name in ("s_dcache_wb", "s_dcache_inv"):
        return lambda w: None
    if name in ("s_memtime", "s_memrealtime"):
        wr = scalar_writer(parse_operand(inst.operands[0]), 64)

        def h(w):
            w.launch.clock += 1
            wr(w, w.launch.clock)
        return h
    if not m:
        return None
    n = int(m.group(2) or 1)
    ops = [parse_operand(o) for o in inst.operands]
    dst = ops[0].index
    if ops[0].kind != "s":
        return None
    base_idx = ops[1].index
    off_ops = ops[2:]
    imm = _sx(int(inst.mods.get("offset", "0"), 0), 21) if "offset" in inst.mods else 0
    soff = None
    for o in off_ops:
        if o.kind == "const":
            imm += _sx(int(o.value), 21)
        else:
            soff = scalar_reader(o)
    is_buffer = m.group(1) == "buffer_load"
    nbytes = 4 * n

    def h(w):
        s = w.s
        if is_buffer:
            base = s[base_idx] | ((s[base_idx + 1] & 0xFFFF) << 32)
            num_records = s[base_idx + 2]
        else:
            base = s[base_idx] | (s[base_idx + 1] << 32)
        off = imm + (soff(w) if soff else 0)
        addr = (base + (off & ~3)) & M64  # SMEM ignores the low two address bits
        data = MEM8[addr - MEM_BASE: addr - MEM_BASE + nbytes].view(np.uint32)
        vals = data.tolist()
        if is_buffer:
            vals = [v if (off & ~3) + 4 * i + 4 <= num_records else 0 for i, v in enumerate(vals)]
        s[dst: dst + n] = vals
        w.launch.counters.smem_bytes += nbytes
    return h
