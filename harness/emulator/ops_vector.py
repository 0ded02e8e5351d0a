"""Vector ALU instructions (VOP1/VOP2/VOP3/VOP3P/VOPC, DPP and SDWA forms), lane-vectorised with numpy.

Most opcodes are rows of semantics.OPS (result type, source types, numpy function on typed lane values); the
generic builder handles operand types, op_sel, neg/abs, clamp/omod, DPP and SDWA around them; opcodes with extra
outputs (carries, lane reads, swaps) have their own builders below.
"""

from __future__ import annotations

import re

import numpy as np

from .lanes import SDWA_SEL, dpp_source_lanes, dpp_write_lanes
from .operands import (WIDTH, FLOAT_TYPES, OperandError, exec_mask, parse_operand, raw_reader,
                       row_of, row_writer, scalar_reader, scalar_writer, store_row, to_bits, typed_reader)
from .state import EXEC_HI, EXEC_LO, WAVE, lane_mask, pack_mask
from .semantics import F32, F64, I32, I64, OPS, PK16, PK32, U32, U64, _bitop3, _class_mask, _fma32, _popc


# ---- mnemonic parsing -----------------------------------------------------------------------------

def split_encoding(name: str) -> tuple[str, str]:
    for enc in ("_e32", "_e64", "_dpp", "_sdwa"):
        if name.endswith(enc):
            return name[: -len(enc)], enc[1:]
    return name, ""


def _bits_list(text, n, default):
    if text is None:
        return [default] * n
    vals = [int(x) for x in text.strip("[]").split(",")]
    return vals + [default] * (n - len(vals))


def _omod_clamp(inst, typ):
    clamp = "clamp" in inst.mods
    scale = 1.0
    if "mul" in inst.mods:
        scale = float(inst.mods["mul"])
    if "div" in inst.mods:
        scale = 1.0 / float(inst.mods["div"])
    if (clamp or scale != 1.0) and typ not in FLOAT_TYPES:
        raise OperandError(f"integer clamp/omod not implemented ({inst.text})")
    if not clamp and scale == 1.0:
        return None
    dt = F64 if typ == "f64" else F32

    def post(v):
        v = np.asarray(v, dt)
        if scale != 1.0:
            v = (v * dt(scale)).astype(dt)
        if clamp:
            v = np.where(np.isnan(v), dt(0), np.clip(v, 0, 1)).astype(dt)
        return v
    return post


class Dpp:
    """Source-lane permutation of src0 and the lanes a DPP instruction may write."""

    def __init__(self, mods):
        self.src = dpp_source_lanes(mods)
        self.valid = self.src >= 0
        self.src_clamped = np.where(self.valid, self.src, 0)
        self.writable = dpp_write_lanes(mods)
        self.bound_zero = "bound_ctrl" in mods
        self.fetch_inactive = mods.get("fi", "0") not in ("0",)

    def wrap(self, reader):
        """Reader of src0 as seen through the permutation (raw bits, before typing); lanes on the last axis,
        so a lockstep batch's (waves, 64) rows permute as one."""
        def read(w):
            v = reader(w)
            out = np.broadcast_to(v, np.broadcast_shapes(np.shape(v), (WAVE,)))[..., self.src_clamped]
            if self.bound_zero:
                out = np.where(self._source_ok(w), out, out.dtype.type(0))
            return out
        return read

    def _source_ok(self, w):
        ok = self.valid
        if not self.fetch_inactive:
            ex = exec_mask(w)           # None: every lane active; (waves, 64) in a batch whose EXEC differ
            if ex is not None:
                ok = ok & ex[..., self.src_clamped]
        return ok

    def mask(self, w, exec_m):
        m = self.writable if exec_m is None else (self.writable & exec_m)
        if not self.bound_zero:
            m = m & self._source_ok(w)
        return m


def _sdwa_src_sel(inst, i, op):
    key = f"src{i}_sel"
    if key not in inst.mods:
        return None
    shift, bits = SDWA_SEL[inst.mods[key]]
    return (shift, bits, op.sext)


def build_generic(inst, ctx, base, enc):
    typ, stypes, fn = OPS[base]
    ops = [parse_operand(o) for o in inst.operands]
    acc = ctx.acc_offset
    dst, srcs = ops[0], ops[1:]
    if len(srcs) != len(stypes):
        raise OperandError(f"{inst.mnemonic}: expected {len(stypes)} sources, got {len(srcs)}")
    op_sel = _bits_list(inst.mods.get("op_sel"), len(stypes) + 1, 0)
    dpp = Dpp(inst.mods) if enc == "dpp" else None
    readers = []
    for i, (op, t) in enumerate(zip(srcs, stypes)):
        sel = _sdwa_src_sel(inst, i, op) if enc == "sdwa" else None
        if dpp is not None and i == 0:
            raw = dpp.wrap(raw_reader(op, acc, 64 if WIDTH[t] == 64 else 32))
            readers.append(_typed_from_raw(raw, op, t, hi=bool(op_sel[i])))
        else:
            readers.append(typed_reader(op, t, acc, hi=bool(op_sel[i]) and WIDTH[t] == 16, sel=sel))
    post = _omod_clamp(inst, typ)
    write = _sdwa_writer(inst, dst, typ, acc) if enc == "sdwa" else row_writer(
        dst, typ, acc, hi=bool(op_sel[len(stypes)]) and WIDTH[typ] == 16)
    return _assemble(fn, readers, post, write, dpp)


def _typed_from_raw(raw, op, t, hi=False):
    """typed_reader semantics over an arbitrary raw-bits reader (used for DPP's permuted src0)."""
    class _Fake:
        pass
    from . import operands as O
    fake = O.Operand("v", 0, neg=op.neg, abs=op.abs)
    base = O.typed_reader(fake, t, 0, hi=hi and WIDTH[t] == 16)
    # typed_reader reads w.v[0]; give it an object whose v[0] is the permuted value.

    def read(w):
        f = _Fake()
        f.v = (raw(w),)
        return base(f)
    return read


def _sdwa_writer(inst, dst, typ, acc):
    r = row_of(dst, acc)
    shift, bits = SDWA_SEL[inst.mods.get("dst_sel", "DWORD")]
    unused = inst.mods.get("dst_unused", "UNUSED_PAD")
    fmask = U32(((1 << bits) - 1) << shift) if bits < 32 else U32(0xFFFFFFFF)

    def wr(w, val, mask):
        b = np.broadcast_to(to_bits(val, typ), (WAVE,)).astype(U32)
        if bits < 32:
            b = (b << U32(shift)) & fmask
            if unused == "UNUSED_PRESERVE":
                b = b | (w.v[r] & ~fmask)
            elif unused == "UNUSED_SEXT":
                top = (b >> U32(shift + bits - 1)) & U32(1)
                above = U32((0xFFFFFFFF << (shift + bits)) & 0xFFFFFFFF)
                b = b | np.where(top == 1, above, U32(0))
        store_row(w, r, b, mask)
    return wr


def _assemble(fn, readers, post, write, dpp):
    n = len(readers)
    if dpp is None and post is None:
        if n == 1:
            (r0,) = readers
            return lambda w: write(w, fn(r0(w)), exec_mask(w))
        if n == 2:
            r0, r1 = readers
            return lambda w: write(w, fn(r0(w), r1(w)), exec_mask(w))
        if n == 3:
            r0, r1, r2 = readers
            return lambda w: write(w, fn(r0(w), r1(w), r2(w)), exec_mask(w))

    def h(w):
        v = fn(*[r(w) for r in readers])
        if post is not None:
            v = post(v)
        m = exec_mask(w)
        if dpp is not None:
            m = dpp.mask(w, m)
        write(w, v, m)
    return h


# ---- special VALU builders ------------------------------------------------------------------------

def _mac(inst, ctx, base, enc):
    """v_fmac/v_mac: the destination is also the addend."""
    fma_name = {"v_fmac_f32": "v_fma_f32", "v_mac_f32": "v_mad_f32", "v_fmac_f16": "v_fma_f16",
                "v_mac_f16": "v_mad_f16", "v_fmac_f64": "v_fma_f64"}[base]
    typ, stypes, fn = OPS[fma_name]
    ops = [parse_operand(o) for o in inst.operands]
    acc = ctx.acc_offset
    dpp = Dpp(inst.mods) if enc == "dpp" else None
    r0 = typed_reader(ops[1], typ, acc)
    if dpp is not None:
        r0 = _typed_from_raw(dpp.wrap(raw_reader(ops[1], acc)), ops[1], typ)
    readers = [r0, typed_reader(ops[2], typ, acc), typed_reader(parse_operand(ops[0].text), typ, acc)]
    return _assemble(fn, readers, _omod_clamp(inst, typ), row_writer(ops[0], typ, acc), dpp)


def _literal_mad(inst, ctx, base, enc):
    """v_madmk/madak/fmamk/fmaak: one source is the instruction's literal."""
    ops = [parse_operand(o) for o in inst.operands]
    acc = ctx.acc_offset
    typ = "f16" if base.endswith("f16") else "f32"
    fn = _fma32 if "fma" in base else (lambda a, b, c: a * b + c)
    # The assembly order is the product's: mk `vdst, src0, K, src1` (S0 * K + S1), ak `vdst, src0, src1, K`
    # (S0 * S1 + K); either way operands 1 and 2 multiply and operand 3 adds.
    readers = [typed_reader(o, typ, acc) for o in ops[1:4]]
    return _assemble(fn, readers, None, row_writer(ops[0], typ, acc), None)


def _carry_op(inst, ctx, base, enc):
    ops = [parse_operand(o) for o in inst.operands]
    acc = ctx.acc_offset
    kind = base[2:].replace("_co_u32", "")  # add, addc, sub, subb, subrev, subbrev
    dst, cout = ops[0], ops[1]
    a, b = raw_reader(ops[2], acc), raw_reader(ops[3], acc)
    cin = scalar_reader(ops[4], 64) if len(ops) > 4 else None
    wr = row_writer(dst, "u32", acc)
    cwr = scalar_writer(cout, 64)
    clamp = "clamp" in inst.mods

    def h(w):
        x, y = a(w).astype(np.int64), b(w).astype(np.int64)
        c = 0
        if cin is not None:
            c = ((np.uint64(cin(w)) >> np.arange(WAVE, dtype=np.uint64)) & np.uint64(1)).astype(np.int64)
        if kind in ("subrev", "subbrev"):
            x, y = y, x
        r = x + y + c if kind in ("add", "addc") else x - y - c
        carry = (r > 0xFFFFFFFF) | (r < 0)
        if clamp:
            r = np.clip(r, 0, 0xFFFFFFFF)
        m = exec_mask(w)
        wr(w, r.astype(U32), m)
        carry = np.broadcast_to(carry, (WAVE,))
        cwr(w, pack_mask(carry if m is None else carry & m))
    return h


def _cndmask(inst, ctx, base, enc):
    ops = [parse_operand(o) for o in inst.operands]
    acc = ctx.acc_offset
    typ = "f32" if any(o.neg or o.abs for o in ops[1:3]) else "b32"
    if base == "v_cndmask_b16":
        typ = "b16"
    dpp = Dpp(inst.mods) if enc == "dpp" else None
    r0 = typed_reader(ops[1], typ, acc, sel=_sdwa_src_sel(inst, 0, ops[1]) if enc == "sdwa" else None)
    if dpp is not None:
        r0 = _typed_from_raw(dpp.wrap(raw_reader(ops[1], acc)), ops[1], typ)
    r1 = typed_reader(ops[2], typ, acc, sel=_sdwa_src_sel(inst, 1, ops[2]) if enc == "sdwa" else None)
    cond = scalar_reader(ops[3], 64) if len(ops) > 3 else (lambda w: w.s[106] | (w.s[107] << 32))
    write = _sdwa_writer(inst, ops[0], typ, acc) if enc == "sdwa" else row_writer(ops[0], typ, acc)

    def h(w):
        v = np.where(lane_mask(cond(w)), r1(w), r0(w))
        m = exec_mask(w)
        if dpp is not None:
            m = dpp.mask(w, m)
        write(w, v, m)
    if dpp is not None or enc == "sdwa":
        return h

    def group(waves):
        """Lockstep (lockstep.py): the select over the group's (waves, 64) registers at once, each wave's
        condition and EXEC its own."""
        from .lockstep import batch_of
        run, b = batch_of(waves)
        if b is None:
            h(run[0])
            return
        c = np.stack([lane_mask(cond(w)) for w in run])
        write(b, np.where(c, r1(b), r0(b)), exec_mask(b))
    h.group = group
    return h


def _readlane(inst, ctx, base, enc):
    ops = [parse_operand(o) for o in inst.operands]
    acc = ctx.acc_offset
    wr = scalar_writer(ops[0])
    src = raw_reader(ops[1], acc)
    if base == "v_readfirstlane_b32":
        def h(w):
            ex = w.s[EXEC_LO] | (w.s[EXEC_HI] << 32)
            lane = (ex & -ex).bit_length() - 1 if ex else 0
            wr(w, int(np.broadcast_to(src(w), (WAVE,))[lane]))
        return h
    sel = scalar_reader(ops[2])

    def h(w):
        wr(w, int(np.broadcast_to(src(w), (WAVE,))[sel(w) & 63]))
    return h


def _writelane(inst, ctx, base, enc):
    ops = [parse_operand(o) for o in inst.operands]
    r = row_of(ops[0], ctx.acc_offset)
    val, sel = scalar_reader(ops[1]), scalar_reader(ops[2])

    def h(w):
        w.v[r, sel(w) & 63] = val(w)
    return h


def _permlane_swap(inst, ctx, base, enc):
    """v_permlane16_swap: odd 16-lane rows of vdst <-> even rows of src0; 32_swap: upper half of vdst <->
    lower half of src0. Both registers are written."""
    ops = [parse_operand(o) for o in inst.operands]
    a, b = row_of(ops[0], ctx.acc_offset), row_of(ops[1], ctx.acc_offset)
    if base == "v_permlane16_swap_b32":
        pairs = [(16, 0), (48, 32)]
        width = 16
    else:
        pairs = [(32, 0)]
        width = 32

    def h(w):
        va, vb = w.v[a], w.v[b]
        for da, sb in pairs:
            tmp = va[da:da + width].copy()
            va[da:da + width] = vb[sb:sb + width]
            vb[sb:sb + width] = tmp
    return h


def _mbcnt(inst, ctx, base, enc):
    ops = [parse_operand(o) for o in inst.operands]
    acc = ctx.acc_offset
    a, b = raw_reader(ops[1], acc), raw_reader(ops[2], acc)
    wr = row_writer(ops[0], "u32", acc)
    lanes = np.arange(WAVE)
    if base == "v_mbcnt_lo_u32_b32":
        below = np.where(lanes >= 32, 32, lanes)
    else:
        below = np.clip(lanes - 32, 0, 32)
    below_mask = ((np.uint64(1) << below.astype(np.uint64)) - np.uint64(1)).astype(U64)

    def h(w):
        m = np.asarray(a(w), U32).astype(U64) & below_mask
        wr(w, _popc((m & U64(0xFFFFFFFF)).astype(U32)) + b(w), exec_mask(w))
    return h


def _mad64(inst, ctx, base, enc):
    ops = [parse_operand(o) for o in inst.operands]
    acc = ctx.acc_offset
    signed = base == "v_mad_i64_i32"
    a, b = raw_reader(ops[2], acc), raw_reader(ops[3], acc)
    c = raw_reader(ops[4], acc, 64)
    wr = row_writer(ops[0], "b64", acc)
    cwr = scalar_writer(ops[1], 64)

    def h(w):
        if signed:
            p = np.asarray(a(w), U32).view(I32).astype(I64) * np.asarray(b(w), U32).view(I32).astype(I64)
            p = p.view(U64) if p.ndim else np.array(p).view(U64)
        else:
            p = np.asarray(a(w), U32).astype(U64) * np.asarray(b(w), U32).astype(U64)
        cv = np.asarray(c(w), U64)
        r = p + cv
        if signed:
            carry = np.zeros(np.shape(r), bool)
        else:
            carry = r < cv
        m = exec_mask(w)
        wr(w, r, m)
        carry = np.broadcast_to(carry, (WAVE,))
        cwr(w, pack_mask(carry if m is None else carry & m))
    return h


def _div_scale(inst, ctx, base, enc):
    # Simplified: no pre-scaling (exact for operands away from the float range limits); VCC = 0.
    ops = [parse_operand(o) for o in inst.operands]
    acc = ctx.acc_offset
    typ = "f64" if base.endswith("f64") else "f32"
    s0 = typed_reader(ops[2], typ, acc)
    wr, cwr = row_writer(ops[0], typ, acc), scalar_writer(ops[1], 64)

    def h(w):
        wr(w, s0(w), exec_mask(w))
        cwr(w, 0)

    def group(waves):
        """Lockstep (lockstep.py): the rows of the group's waves at once under each wave's EXEC; VCC per wave."""
        from .lockstep import batch_of
        run, b = batch_of(waves)
        if b is None:
            h(run[0])
            return
        wr(b, s0(b), exec_mask(b))
        for w in run:
            cwr(w, 0)
    if typ == "f32":
        h.group = group
    return h


def _div_fmas(inst, ctx, base, enc):
    typ = "f64" if base.endswith("f64") else "f32"
    ops = [parse_operand(o) for o in inst.operands]
    acc = ctx.acc_offset
    r = [typed_reader(o, typ, acc) for o in ops[1:4]]
    wr = row_writer(ops[0], typ, acc)
    fn = _fma32 if typ == "f32" else (lambda a, b, c: a * b + c)

    def h(w):
        wr(w, fn(r[0](w), r[1](w), r[2](w)), exec_mask(w))
    return h


def _div_fixup(inst, ctx, base, enc):
    typ = "f64" if base.endswith("f64") else ("f16" if base.endswith("f16") else "f32")
    ops = [parse_operand(o) for o in inst.operands]
    acc = ctx.acc_offset
    q, den, num = (typed_reader(o, typ, acc) for o in ops[1:4])
    wr = row_writer(ops[0], typ, acc)

    def h(w):
        qv, d, n = q(w), den(w), num(w)
        special = ~np.isfinite(d) | ~np.isfinite(n) | (d == 0)
        exact = (np.asarray(n, F64) / np.asarray(d, F64))
        wr(w, np.where(special, exact, qv), exec_mask(w))
    return h


def _accvgpr(inst, ctx, base, enc):
    ops = [parse_operand(o) for o in inst.operands]
    src = raw_reader(ops[1], ctx.acc_offset)
    wr = row_writer(ops[0], "b32", ctx.acc_offset)
    return lambda w: wr(w, src(w), exec_mask(w))


def _bitop3_build(inst, ctx, base, enc):
    ops = [parse_operand(o) for o in inst.operands]
    acc = ctx.acc_offset
    table = int(inst.mods.get("bitop3", "0"), 0)
    fn = _bitop3(table)
    if base == "v_bitop3_b16":
        op_sel = _bits_list(inst.mods.get("op_sel"), 4, 0)
        readers = [typed_reader(o, "b16", acc, hi=bool(op_sel[i])) for i, o in enumerate(ops[1:4])]
        return _assemble(fn, readers, None, row_writer(ops[0], "b16", acc, hi=bool(op_sel[3])), None)
    readers = [raw_reader(o, acc) for o in ops[1:4]]
    return _assemble(fn, readers, None, row_writer(ops[0], "b32", acc), None)


# ---- VOPC -----------------------------------------------------------------------------------------

_FCMP = {
    "f": lambda a, b: np.zeros(np.broadcast(a, b).shape, bool), "lt": np.less, "eq": np.equal, "le": np.less_equal,
    "gt": np.greater, "lg": lambda a, b: (a < b) | (a > b), "ge": np.greater_equal,
    "o": lambda a, b: ~np.isnan(a) & ~np.isnan(b), "u": lambda a, b: np.isnan(a) | np.isnan(b),
    "nge": lambda a, b: ~(a >= b), "nlg": lambda a, b: ~((a < b) | (a > b)), "ngt": lambda a, b: ~(a > b),
    "nle": lambda a, b: ~(a <= b), "neq": lambda a, b: ~(a == b), "nlt": lambda a, b: ~(a < b),
    "tru": lambda a, b: np.ones(np.broadcast(a, b).shape, bool),
}
_ICMP = {
    "f": _FCMP["f"], "lt": np.less, "eq": np.equal, "le": np.less_equal, "gt": np.greater,
    "ne": np.not_equal, "lg": np.not_equal, "ge": np.greater_equal, "t": _FCMP["tru"],
}


def build_vopc(inst, ctx, base, enc):
    m = re.match(r"v_cmp(x?)_(\w+?)_([fiub])(16|32|64)$", base)
    if m is None:
        m2 = re.match(r"v_cmp(x?)_class_f(16|32|64)$", base)
        if m2 is None:
            return None
        op, t = "class", f"f{m2.group(2)}"
        is_x = bool(m2.group(1))
    else:
        is_x, op, t = bool(m.group(1)), m.group(2), m.group(3) + m.group(4)
    acc = ctx.acc_offset
    ops = [parse_operand(o) for o in inst.operands]
    if ops and ops[0].kind == "s" and (len(ops) == 3):
        sdst, srcs = ops[0], ops[1:]
    else:
        sdst, srcs = None, ops
    if t.startswith("b"):
        t = "u" + t[1:]
    if op == "class":
        fn = _class_mask
        readers = [typed_reader(srcs[0], t, acc), typed_reader(srcs[1], "u32", acc)]
    else:
        fn = (_FCMP if t.startswith("f") else _ICMP).get(op)
        if fn is None:
            return None
        sels = [_sdwa_src_sel(inst, i, o) if enc == "sdwa" else None for i, o in enumerate(srcs)]
        readers = [typed_reader(o, t, acc, sel=s) for o, s in zip(srcs, sels)]
    wr = scalar_writer(sdst, 64) if sdst is not None else None
    r0, r1 = readers

    def put(w, bits):
        if wr is not None:
            wr(w, bits)
        elif not is_x:
            w.s[106], w.s[107] = bits & 0xFFFFFFFF, bits >> 32
        if is_x:
            w.s[EXEC_LO], w.s[EXEC_HI] = bits & 0xFFFFFFFF, bits >> 32

    def h(w):
        ex = w.s[EXEC_LO] | (w.s[EXEC_HI] << 32)
        res = np.broadcast_to(fn(r0(w), r1(w)), (WAVE,))
        put(w, pack_mask(res) & ex)

    def group(waves):
        """Lockstep (lockstep.py): the compare over the group's (waves, 64) registers at once; each wave's
        mask written to its own SGPRs."""
        from .lockstep import batch_of
        run, b = batch_of(waves)
        if b is None:
            h(run[0])
            return
        res = np.broadcast_to(fn(r0(b), r1(b)), (len(run), WAVE))
        packed = np.packbits(res, axis=1, bitorder="little").view(np.uint64)[:, 0].tolist()
        for w, bits in zip(run, packed):
            put(w, bits & (w.s[EXEC_LO] | (w.s[EXEC_HI] << 32)))
    h.group = group
    return h


# ---- VOP3P (packed) -------------------------------------------------------------------------------

def _half(raw, hi, typ):
    bits = (raw >> U32(16)) if hi else raw
    bits = np.asarray(bits, U32) & U32(0xFFFF)
    if typ == "f16":
        return bits.astype(np.uint16).view(np.float16).astype(F32)
    if typ == "bf16":
        return (bits << U32(16)).view(F32)
    if typ == "i16":
        return ((bits << U32(16)).view(I32) >> 16)
    return bits


def _packed_const_reader(op, typ, acc):
    # Inline constants in packed math supply the same 16-bit value to both halves (UNSURE for op_sel_hi=1).
    if op.kind == "const":
        from .operands import const_bits
        c = const_bits(op, typ if typ in ("f16", "bf16") else "b16")
        val = np.array(c | (c << 16), U32)
        return lambda w: val
    return raw_reader(op, acc)


def build_pk16(inst, ctx, base, enc):
    row = PK16[base]
    typ, n, fn = row.result, len(row.sources), row.fn
    ops = [parse_operand(o) for o in inst.operands]
    acc = ctx.acc_offset
    raws = [_packed_const_reader(o, typ, acc) for o in ops[1:1 + n]]
    op_sel = _bits_list(inst.mods.get("op_sel"), n, 0)
    op_sel_hi = _bits_list(inst.mods.get("op_sel_hi"), n, 1)
    neg_lo = _bits_list(inst.mods.get("neg_lo"), n, 0)
    neg_hi = _bits_list(inst.mods.get("neg_hi"), n, 0)
    r = row_of(ops[0], acc)
    clamp = "clamp" in inst.mods

    def h(w):
        vals = [np.asarray(x(w), U32) for x in raws]
        lo = [_half(v, op_sel[i], typ) for i, v in enumerate(vals)]
        hi = [_half(v, op_sel_hi[i], typ) for i, v in enumerate(vals)]
        if typ == "f16":
            lo = [-x if neg_lo[i] else x for i, x in enumerate(lo)]
            hi = [-x if neg_hi[i] else x for i, x in enumerate(hi)]
        rl, rh = fn(*lo), fn(*hi)
        if clamp and typ == "f16":
            rl, rh = np.clip(rl, 0, 1), np.clip(rh, 0, 1)
        bits = to_bits(rl, typ) | (to_bits(rh, typ) << U32(16))
        store_row(w, r, bits, exec_mask(w))
    return h


def build_pk32(inst, ctx, base, enc):
    row = PK32[base]
    n, fn = len(row.sources), row.fn
    ops = [parse_operand(o) for o in inst.operands]
    acc = ctx.acc_offset
    op_sel = _bits_list(inst.mods.get("op_sel"), n, 0)
    op_sel_hi = _bits_list(inst.mods.get("op_sel_hi"), n, 1)
    neg_lo = _bits_list(inst.mods.get("neg_lo"), n, 0)
    neg_hi = _bits_list(inst.mods.get("neg_hi"), n, 0)

    def half_reader(op, which):
        if op.kind == "const":
            from .operands import const_bits
            c = np.array(const_bits(op, "f32"), U32)
            return lambda w: c
        if op.kind in ("v", "a"):
            rr = row_of(op, acc) + which
            return lambda w: w.v[rr]
        i = op.index + which
        return lambda w: np.array(w.s[i], U32)
    lo_r = [half_reader(o, op_sel[i]) for i, o in enumerate(ops[1:1 + n])]
    hi_r = [half_reader(o, op_sel_hi[i]) for i, o in enumerate(ops[1:1 + n])]
    r = row_of(ops[0], acc)

    if fn is None:  # v_pk_mov_b32: D.lo = src0[op_sel[0]], D.hi = src1[op_sel[1]]
        mov_hi = half_reader(ops[2], op_sel[1])

        def h(w):
            m = exec_mask(w)
            lo, hi = lo_r[0](w).copy(), mov_hi(w).copy()
            store_row(w, r, lo, m)
            store_row(w, r + 1, hi, m)
        return h

    def h(w):
        lo = [x(w).view(F32) for x in lo_r]
        hi = [x(w).view(F32) for x in hi_r]
        lo = [-x if neg_lo[i] else x for i, x in enumerate(lo)]
        hi = [-x if neg_hi[i] else x for i, x in enumerate(hi)]
        # compute both halves before writing: the destination pair may alias a source
        rl, rh = np.asarray(fn(*lo), F32).view(U32), np.asarray(fn(*hi), F32).view(U32)
        m = exec_mask(w)
        store_row(w, r, rl, m)
        store_row(w, r + 1, rh, m)
    return h


def build_dot(inst, ctx, base, enc):
    """v_dot2_f32_f16/bf16, v_dot2c_f32_f16/bf16, v_dot2_{i32_i16,u32_u16}, v_dot4/8 integer dots."""
    m = re.match(r"v_dot(\d)c?_([fiu])32_([a-z]+\d+)$", base)
    if not m:
        return None
    k, rtyp, styp = int(m.group(1)), m.group(2), m.group(3)
    ops = [parse_operand(o) for o in inst.operands]
    acc = ctx.acc_offset
    is_c = "dot2c" in base or "dot4c" in base
    a, b = raw_reader(ops[1], acc), raw_reader(ops[2], acc)
    c = raw_reader(ops[0] if is_c else ops[3], acc)
    bits = 32 // k
    wr = row_writer(ops[0], "f32" if rtyp == "f" else "u32", acc)

    def elems(v):
        v = np.asarray(v, U32)
        out = []
        for i in range(k):
            e = (v >> U32(bits * i)) & U32((1 << bits) - 1)
            if styp == "f16":
                out.append(e.astype(np.uint16).view(np.float16).astype(F64))
            elif styp == "bf16":
                out.append((e << U32(16)).view(F32).astype(F64))
            elif styp.startswith("i"):
                out.append(((e.astype(np.int64) ^ (1 << (bits - 1))) - (1 << (bits - 1))))
            else:
                out.append(e.astype(np.int64))
        return out

    def h(w):
        ea, eb = elems(a(w)), elems(b(w))
        cv = np.asarray(c(w), U32)
        if rtyp == "f":
            s = cv.view(F32).astype(F64) + sum(x * y for x, y in zip(ea, eb))
            wr(w, s.astype(F32), exec_mask(w))
        else:
            base_c = cv.view(I32).astype(np.int64) if rtyp == "i" else cv.astype(np.int64)
            s = base_c + sum(x * y for x, y in zip(ea, eb))
            wr(w, s.astype(np.int64).astype(U32), exec_mask(w))
    return h


SPECIAL = {
    "v_fmac_f32": _mac, "v_mac_f32": _mac, "v_fmac_f16": _mac, "v_mac_f16": _mac, "v_fmac_f64": _mac,
    "v_madmk_f32": _literal_mad, "v_madak_f32": _literal_mad, "v_fmamk_f32": _literal_mad,
    "v_fmaak_f32": _literal_mad, "v_madmk_f16": _literal_mad, "v_madak_f16": _literal_mad,
    "v_add_co_u32": _carry_op, "v_sub_co_u32": _carry_op, "v_subrev_co_u32": _carry_op,
    "v_addc_co_u32": _carry_op, "v_subb_co_u32": _carry_op, "v_subbrev_co_u32": _carry_op,
    "v_cndmask_b32": _cndmask,
    "v_readfirstlane_b32": _readlane, "v_readlane_b32": _readlane, "v_writelane_b32": _writelane,
    "v_permlane16_swap_b32": _permlane_swap, "v_permlane32_swap_b32": _permlane_swap,
    "v_mbcnt_lo_u32_b32": _mbcnt, "v_mbcnt_hi_u32_b32": _mbcnt,
    "v_mad_u64_u32": _mad64, "v_mad_i64_i32": _mad64,
    "v_div_scale_f32": _div_scale, "v_div_scale_f64": _div_scale,
    "v_div_fmas_f32": _div_fmas, "v_div_fmas_f64": _div_fmas,
    "v_div_fixup_f32": _div_fixup, "v_div_fixup_f64": _div_fixup, "v_div_fixup_f16": _div_fixup,
    "v_accvgpr_read_b32": _accvgpr, "v_accvgpr_write_b32": _accvgpr, "v_accvgpr_mov_b32": _accvgpr,
    "v_bitop3_b32": _bitop3_build, "v_bitop3_b16": _bitop3_build,
}
