"""MFMA and the narrow-float conversions, delegated to mfma.py and numerics.py.

This module only fetches operands in the shapes those modules take and writes their results back.
"""

from __future__ import annotations

import numpy as np

from . import mfma, numerics
from .operands import const_bits, exec_mask, parse_operand, raw_reader, row_of, store_row
from .state import WAVE

U32 = np.uint32


def _list(text):
    return [int(x) for x in text.strip("[]").split(",")]


def asm_mods(inst) -> dict:
    """Instruction modifiers in the dict form mfma/numerics take (lists for op_sel etc., ints otherwise)."""
    out = {}
    for k, v in inst.mods.items():
        if v is True:
            out[k] = True
        elif isinstance(v, str) and v.startswith("["):
            out[k] = _list(v)
        else:
            try:
                out[k] = int(v, 0)
            except (TypeError, ValueError):
                out[k] = v
    return out


def _rows_reader(op, n, acc):
    """Closure w -> (n, 64) uint32 of an n-register operand (constants broadcast)."""
    if op.kind in ("v", "a"):
        r = row_of(op, acc)
        return lambda w: w.v[r: r + n]
    if op.kind == "const":
        c = np.full((n, WAVE), const_bits(op, "b32"), U32)
        return lambda w: c
    if op.kind == "s":
        i = op.index
        return lambda w: np.repeat(np.array(w.s[i: i + n], U32)[:, None], WAVE, axis=1)
    raise ValueError(f"bad matrix operand {op.text}")


def build_mfma(inst, ctx):
    name = inst.mnemonic.removesuffix("_e64")
    if name not in mfma.MFMA_MNEMONICS:
        return None
    ops = [parse_operand(o) for o in inst.operands]
    acc = ctx.acc_offset
    mods = asm_mods(inst)
    a_regs, b_regs, c_regs = mfma.operand_regs(name, mods)
    ra, rb, rc = _rows_reader(ops[1], a_regs, acc), _rows_reader(ops[2], b_regs, acc), _rows_reader(ops[3], c_regs, acc)
    drow = row_of(ops[0], acc)
    scaled = len(ops) >= 6
    if scaled:
        sa, sb = raw_reader(ops[4], acc), raw_reader(ops[5], acc)
    counters = ctx.counters

    def slow(w):
        m = dict(mods)
        if scaled:
            m["scale_a"] = np.broadcast_to(sa(w), (WAVE,))
            m["scale_b"] = np.broadcast_to(sb(w), (WAVE,))
        d = mfma.execute(name, ra(w), rb(w), rc(w), m)
        w.v[drow: drow + c_regs] = d     # MFMA writes every lane regardless of EXEC
        counters.mfma[name] += 1

    fast = mfma.fast_executor(name, mods)   # same bits as mfma.execute, layouts precomputed
    if fast is not None:
        def h(w):
            if scaled:
                x, y = sa(w), sb(w)          # (64,) VGPR rows; an SGPR / constant scale is 0-d
                d = fast(ra(w), rb(w), rc(w), x if x.ndim else np.full(WAVE, x, U32),
                         y if y.ndim else np.full(WAVE, y, U32))
            else:
                d = fast(ra(w), rb(w), rc(w))
            if d is None:                    # no fast path this time (see mfma.fast_executor)
                return slow(w)
            w.v[drow: drow + c_regs] = d     # MFMA writes every lane regardless of EXEC
            counters.mfma[name] += 1

        def rows_of(op, n):
            """(regs, slots) -> (waves, n, 64) of a VGPR/AGPR operand straight from the batch's register
            file, None for another kind (then each wave's reader)."""
            if op.kind in ("v", "a"):
                r = row_of(op, acc)
                return lambda regs, idx: regs[idx, r: r + n]
            return None

        ga, gb, gc = rows_of(ops[1], a_regs), rows_of(ops[2], b_regs), rows_of(ops[3], c_regs)
        if scaled:
            gx = (lambda regs, idx, r=row_of(ops[4], acc): regs[idx, r]) if ops[4].kind in ("v", "a") else None
            gy = (lambda regs, idx, r=row_of(ops[5], acc): regs[idx, r]) if ops[5].kind in ("v", "a") else None

        # where fast.at_regs finds each operand: a VGPR/AGPR row of the batch's register file, or one constant
        # for every wave (a chain's first C = 0); None when an operand is neither (then the gathers below)
        def place(op, n, reader):
            if op.kind in ("v", "a"):
                return row_of(op, acc)
            if op.kind == "const":             # contiguous rows, the same (stride 0) for every slot
                rows = np.ascontiguousarray(np.broadcast_to(np.asarray(reader(None), U32), (n, WAVE)))
                return np.broadcast_to(rows, (1, n, WAVE))
            return None
        places = [place(ops[1], a_regs, ra), place(ops[2], b_regs, rb), place(ops[3], c_regs, rc)]
        if scaled:
            places += [place(ops[4], 1, sa), place(ops[5], 1, sb)]
        direct = all(p is not None for p in places) and all(isinstance(p, int) for p in places[:2])
        if direct:
            a_row, b_row, c_place = places[:3]
            sa_place, sb_place = places[3:] if scaled else (None, None)

        def group(waves):
            """Lockstep (lockstep.py): the group's MFMAs decoded and scaled in one pass, the operands read from
            the batch's register file (each wave's w.v is its row of it): by fast.at_regs in place, else
            gathered for fast.many."""
            regs = waves[0].v.base
            # in slot order: the seeded interleaving shuffles a group's waves, and the same waves in one order
            # find the A operands fast kept for them (mfma._RECENT_A) whatever order they came back in
            idx = np.array(sorted([w.slot for w in waves]), np.int64)
            if direct:
                def rows(p, n):
                    return p if isinstance(p, int) else mfma.Rows(p, idx, 0, n)
                if fast.at_regs(regs, idx, a_row, b_row, rows(c_place, c_regs),
                                sa_place if sa_place is None else rows(sa_place, 1),
                                sb_place if sb_place is None else rows(sb_place, 1), drow):
                    counters.mfma[name] += len(waves)
                    return

            def get(g, reader, shape, const):
                if g is not None:
                    return g(regs, idx)
                if const:                   # one value for every wave (a chain's first C = 0)
                    return np.broadcast_to(reader(waves[0]), (len(waves),) + shape)
                return np.stack([np.broadcast_to(reader(w), shape) for w in waves])
            A = get(ga, ra, (a_regs, WAVE), ops[1].kind == "const")
            B = get(gb, rb, (b_regs, WAVE), ops[2].kind == "const")
            C = get(gc, rc, (c_regs, WAVE), ops[3].kind == "const")
            if scaled:
                d = fast.many(A, B, C, get(gx, sa, (WAVE,), ops[4].kind == "const"),
                              get(gy, sb, (WAVE,), ops[5].kind == "const"))
            else:
                d = fast.many(A, B, C)
            if d is None:
                for w in waves:
                    try:
                        h(w)
                    except Exception as e:
                        e.wave = w          # lockstep names the wave in its report
                        raise
                return
            regs[idx, drow: drow + c_regs] = d      # MFMA writes every lane regardless of EXEC
            counters.mfma[name] += len(waves)
        h.group = group
        return h
    return slow


def build_cvt(inst, ctx):
    base = inst.mnemonic.removesuffix("_e64").removesuffix("_e32")
    if base.endswith("_sdwa"):
        base = base[:-5]
    if base not in numerics.CVT_MNEMONICS:
        return None
    ops = [parse_operand(o) for o in inst.operands]
    acc = ctx.acc_offset
    mods = asm_mods(inst)
    src_dw = numerics.CVT_SRC_DWORDS.get(base, (1,) * (len(ops) - 1))
    dst_dw = numerics.CVT_DST_DWORDS.get(base, 1)
    srcs = ops[1:1 + len(src_dw)]
    mods["abs"] = [int(o.abs) for o in srcs]
    mods["neg"] = [int(o.neg) for o in srcs]
    readers = []
    for o, n in zip(srcs, src_dw):
        rr = _rows_reader(o, n, acc)
        readers.append((lambda w, rr=rr: np.broadcast_to(rr(w)[0], (WAVE,))) if n == 1 else rr)
    drow = row_of(ops[0], acc)

    def h(w):
        old = w.v[drow] if dst_dw == 1 else w.v[drow: drow + dst_dw]
        res = numerics.execute_cvt(base, [r(w) for r in readers], old.copy(), mods)
        m = exec_mask(w)
        if dst_dw == 1:
            store_row(w, drow, res, m)
        else:
            for i in range(dst_dw):
                store_row(w, drow + i, res[i], m)
    if base not in LANEWISE_CVT:
        return h
    vrows = [row_of(o, acc) if o.kind in ("v", "a") else None for o in srcs]

    def group(waves):
        """Lockstep (lockstep.py): one conversion over (waves, 64) (a LANEWISE_CVT handler computes each
        lane from that lane alone), each wave's result stored under its own EXEC."""
        from .lockstep import batch_of
        waves, b = batch_of(waves)      # slot order: each wave writes only its own row, so any order is alone's
        regs = waves[0].v.base
        idx = np.fromiter((w.slot for w in waves), np.intp, len(waves))
        args = [regs[idx, r] if r is not None else np.stack([rd(w) for w in waves])
                for r, rd in zip(vrows, readers)]
        res = numerics.execute_cvt(base, args, regs[idx, drow], mods)
        store_row(b, drow, res, exec_mask(b))       # under each wave's EXEC (a batch's (waves, 64) masks)
    h.group = group
    return h


# Conversions whose result in a lane depends on that lane's sources only (one-dword sources and result): they
# run over a (waves, 64) array as over (64,) (tests/test_lockstep_ops.py::test_lanewise_conversions).
LANEWISE_CVT = frozenset((
    "v_cvt_f32_bf8", "v_cvt_f32_fp8", "v_cvt_pk_bf16_f32", "v_cvt_pk_bf8_f32", "v_cvt_pk_fp8_f32",
    "v_cvt_scalef32_f16_bf8", "v_cvt_scalef32_f16_fp8", "v_cvt_scalef32_f32_bf8", "v_cvt_scalef32_f32_fp8",
    "v_cvt_scalef32_pk_bf16_bf8", "v_cvt_scalef32_pk_bf16_fp8", "v_cvt_scalef32_pk_f16_bf8",
    "v_cvt_scalef32_pk_f16_fp8",
    "v_cvt_scalef32_pk_bf8_f32", "v_cvt_scalef32_pk_fp4_f32", "v_cvt_scalef32_pk_fp8_f32",
    "v_cvt_scalef32_sr_bf8_f32", "v_cvt_scalef32_sr_fp8_f32", "v_cvt_sr_bf8_f32", "v_cvt_sr_fp8_f32"))
