"""Vector memory (global/flat, MUBUF buffer incl. the LDS-direct form) and LDS (DS) instructions.

Global accesses gather/scatter straight into host memory through state.MEM8/MEM32. Buffer accesses apply
the 128-bit resource descriptor's num_records bound: out-of-range loads return 0, stores are dropped, and
out-of-range lanes never touch memory. Every access updates the launch counters.

Under the sanitizer (w.san set, see sanitizer.py) every global/buffer address a lane really touches is
checked against the launch's memory map before it is touched, and results are delivered through
w.san.issue(queue, registers, apply, lds_record) at the covering s_waitcnt instead of at once.
"""

from __future__ import annotations

import re
from operator import itemgetter

import numpy as np

from . import mfma, ranks
from .lanes import swizzle_source_lanes
from .operands import exec_mask, parse_operand, raw_reader, row_of, scalar_reader
from .sanitizer import GroupLoad, issue_group, lds_record
from .semantics import ATOMIC32
from .state import EXEC_HI, EXEC_LO, FULL, M0, MEM8, MEM32, MEM_BASE, WAVE, lane_mask

U32, I32, U64, I64, F32 = np.uint32, np.int32, np.uint64, np.int64, np.float32
VBASE = 128     # sanitizer register-slot bit of VGPR row 0
_ALL = np.ones(WAVE, bool)
_LANE_NUMBERS = np.arange(WAVE)
_ZERO_PAGE = np.zeros(64, np.uint64)        # a harmless address for lanes that must not touch memory
SAFE_ADDR = _ZERO_PAGE.ctypes.data

# suffix -> (bytes, sign-extend bits or 0, d16 half: None/'lo'/'hi')
SIZES = {
    "dword": (4, 0, None), "dwordx2": (8, 0, None), "dwordx3": (12, 0, None), "dwordx4": (16, 0, None),
    "ubyte": (1, 0, None), "sbyte": (1, 8, None), "ushort": (2, 0, None), "sshort": (2, 16, None),
    "byte": (1, 0, None), "short": (2, 0, None),
    "ubyte_d16": (1, 0, "lo"), "ubyte_d16_hi": (1, 0, "hi"), "sbyte_d16": (1, 8, "lo"),
    "sbyte_d16_hi": (1, 8, "hi"), "short_d16": (2, 0, "lo"), "short_d16_hi": (2, 0, "hi"),
    "byte_d16_hi": (1, 0, "hi"),
    "b8": (1, 0, None), "b16": (2, 0, None), "b32": (4, 0, None), "b64": (8, 0, None), "b96": (12, 0, None),
    "b128": (16, 0, None), "u8": (1, 0, None), "i8": (1, 8, None), "u16": (2, 0, None), "i16": (2, 16, None),
    "u8_d16": (1, 0, "lo"), "u8_d16_hi": (1, 0, "hi"), "i8_d16": (1, 8, "lo"), "i8_d16_hi": (1, 8, "hi"),
    "u16_d16": (2, 0, "lo"), "u16_d16_hi": (2, 0, "hi"), "b8_d16_hi": (1, 0, "hi"), "b16_d16_hi": (2, 0, "hi"),
}


# ---- host-memory gather/scatter ---------------------------------------------------------------------

_DWORDS = [np.arange(n) for n in range(5)]      # dword offsets within a 0..16-byte access
# host memory as 4-, 8- and 16-byte elements (state.MEM32's address space): an access of nbytes aligned to
# nbytes is one element, so a gather or scatter takes one index a lane
_WIDE = {4: MEM32, 8: type(MEM32)((MEM32.size // 2,), np.uint64, MEM32.data),
         16: type(MEM32)((MEM32.size // 4,), np.dtype("V16"), MEM32.data)}
_WIDE_SHIFT = {4: 2, 8: 3, 16: 4}


def mem_read(addrs: np.ndarray, nbytes: int) -> np.ndarray:
    """(k,) byte addresses -> (k, nbytes) uint8 copy of host memory."""
    a = np.asarray(addrs, np.int64)                     # read only: no copy needed
    wide = _WIDE.get(nbytes)
    if wide is not None and not (a & (nbytes - 1)).any():
        i = a - MEM_BASE
        i >>= _WIDE_SHIFT[nbytes]
        return wide.take(i).view(np.uint8).reshape(len(a), nbytes)
    if nbytes % 4 == 0 and not (a & 3).any():
        idx = ((a - MEM_BASE) >> 2)[:, None] + (_DWORDS[nbytes // 4] if nbytes <= 16 else np.arange(nbytes // 4))
        return MEM32.take(idx).view(np.uint8).reshape(len(a), nbytes)
    idx = (a - MEM_BASE)[:, None] + np.arange(nbytes)
    return MEM8[idx]


def mem_write(addrs: np.ndarray, data: np.ndarray) -> None:
    """Scatter (k, nbytes) uint8 rows to host memory (later lanes win on overlap)."""
    a = np.asarray(addrs, np.int64)
    nbytes = data.shape[1]
    wide = _WIDE.get(nbytes)
    if wide is not None and not (a & (nbytes - 1)).any():
        i = a - MEM_BASE
        i >>= _WIDE_SHIFT[nbytes]
        wide[i] = np.ascontiguousarray(data).view(wide.dtype).reshape(-1)
        return
    if nbytes % 4 == 0 and not (a & 3).any():
        idx = ((a - MEM_BASE) >> 2)[:, None] + np.arange(nbytes // 4)
        MEM32[idx] = np.ascontiguousarray(data).view(U32)
        return
    idx = (a - MEM_BASE)[:, None] + np.arange(nbytes)
    MEM8[idx] = data


def _rows_to_bytes(w, row, nbytes, active):
    """(k, nbytes) bytes of the data registers of the active lanes."""
    ndw = (nbytes + 3) // 4
    regs = w.v[row: row + ndw][:, active].T.copy()          # (k, ndw)
    return regs.view(np.uint8).reshape(-1, ndw * 4)[:, :nbytes]


def _bytes_to_rows(w, row, data, active, nbytes, sext, d16):
    """Write loaded bytes (k, nbytes) to the destination registers of the active lanes."""
    k = data.shape[0]
    if nbytes >= 4:
        vals = np.ascontiguousarray(data).view(U32).reshape(k, nbytes // 4).T
        if active is _ALL:
            w.v[row: row + nbytes // 4] = vals
        else:
            w.v[row: row + nbytes // 4, active] = vals
        return
    v = data[:, 0].astype(U32) if nbytes == 1 else np.ascontiguousarray(data).view(np.uint16)[:, 0].astype(U32)
    if sext:
        sh = U32(32 - sext)
        v = ((v << sh).view(I32) >> I32(32 - sext)).view(U32)
    if d16 is None:
        w.v[row, active] = v
    elif d16 == "lo":
        w.v[row, active] = (w.v[row, active] & U32(0xFFFF0000)) | (v & U32(0xFFFF))
    else:
        w.v[row, active] = (w.v[row, active] & U32(0xFFFF)) | (v << U32(16))


def _active(w):
    ex = w.s[EXEC_LO] | (w.s[EXEC_HI] << 32)
    return _ALL if ex == FULL else lane_mask(ex)


def _vmask(row, ndw):
    return ((1 << max(1, ndw)) - 1) << (VBASE + row)


def _deliver(w, queue, mask, apply, lds_rec=None):
    """Hand a result to the sanitizer (delivered at the covering s_waitcnt) or deliver it now."""
    s = w.san
    if s is None:
        if apply is not None:
            apply()
    else:
        s.issue(queue, mask, apply, lds_rec)


def _slots(waves):
    """The waves' register slots (rows of the lockstep batch's register file) as an index array."""
    return np.fromiter((w.slot for w in waves), np.intp, len(waves))


_TILES = {}


def _lane_tile(n):
    """Lane numbers of n whole waves ((n * 64,) intp, shared: read only)."""
    t = _TILES.get(n)
    if t is None:
        t = _TILES[n] = np.tile(_LANE_NUMBERS, n)
        t.flags.writeable = False
    return t


def _dword_load(waves, slots, row, data):
    """The GroupLoad of whole dwords gathered lane-major ((W, 64, nbytes) uint8) into rows from `row`."""
    return GroupLoad(waves[0].v.base, slots, row, data.view(U32).reshape(len(slots), WAVE, -1).transpose(0, 2, 1))


def _check(w, a, nbytes, act, what, read, write):
    """Memory-map check of the addresses `a` (the active lanes `act`, or a lane-index array)."""
    s = w.san
    if s is not None and s.mem is not None and len(a):
        s.mem.check(a, nbytes, act, what, read, write)      # a bool `act` becomes lane numbers there


def _one_by_one(h, waves):
    """Run a handler wave by wave in the group's order (lockstep's fallback); an exception names its wave."""
    for w in waves:
        try:
            h(w)
        except Exception as e:
            e.wave = w
            raise


def _race_rec(w, write, addrs, nbytes):
    """The race record of one wave's LDS access (None without the race detector)."""
    s = w.san
    return lds_record(write, addrs, nbytes, w.lds_size) if s is not None and s.races is not None else None


# ---- atomics ------------------------------------------------------------------------------------------

def _atomic_rmw(read_one, write_one, addrs, vals, op, cmp=None):
    """Apply an atomic lane by lane (lanes hitting one address see each other's results)."""
    olds = np.zeros(len(addrs), U32)
    for i, a in enumerate(addrs.tolist()):
        o = read_one(a)
        olds[i] = o
        if cmp is not None:
            new = vals[i] if o == cmp[i] else o
        else:
            new = op(np.array(o, U32), np.array(vals[i], U32))
        write_one(a, int(new))
    return olds


_local_rmw = _atomic_rmw


def _global_read_one(a):
    return int(MEM8[a - MEM_BASE: a - MEM_BASE + 4].view(U32)[0])


def _global_write_one(a, v):
    MEM8[a - MEM_BASE: a - MEM_BASE + 4].view(U32)[0] = v


# ---- global / flat ------------------------------------------------------------------------------------

def build_global(inst, ctx):
    m = re.match(r"(global|flat)_(load|store|atomic)_(\w+)$", inst.mnemonic)
    if not m:
        return None
    kind, what = m.group(2), m.group(3)
    ops = [parse_operand(o) for o in inst.operands]
    acc = ctx.acc_offset
    offset = int(inst.mods.get("offset", "0"), 0)
    counters = ctx.counters
    returns = kind == "load" or (kind == "atomic" and ("sc0" in inst.mods or "glc" in inst.mods))

    if kind == "load":
        dst, addr_ops = ops[0], ops[1:]
    elif kind == "store":
        dst, addr_ops = None, [ops[0]] + ops[2:]
        data_op = ops[1]
    else:
        if returns:
            dst, addr_ops, data_op = ops[0], [ops[1]] + ops[3:], ops[2]
        else:
            dst, addr_ops, data_op = None, [ops[0]] + ops[2:], ops[1]
    vaddr = addr_ops[0]
    saddr = addr_ops[1] if len(addr_ops) > 1 and addr_ops[1].kind != "off" else None
    if saddr is not None:
        sread = scalar_reader(saddr, 64)
        vread = raw_reader(vaddr, acc, 32)

        def address(w):
            return np.uint64(sread(w)) + vread(w).astype(U64) + U64(offset & 0xFFFFFFFFFFFFFFFF if offset >= 0 else 0) - U64(-offset if offset < 0 else 0)
    else:
        vread = raw_reader(vaddr, acc, 64)

        def address(w):
            return (vread(w).astype(np.int64) + offset).astype(U64)

    if kind == "atomic":
        return _global_atomic(inst, ctx, what, address, data_op, dst, returns)
    if what not in SIZES:
        return None
    nbytes, sext, d16 = SIZES[what]
    name = inst.mnemonic
    if kind == "load":
        row = row_of(dst, acc)
        dmask = _vmask(row, nbytes // 4)

        def h(w):
            act = _active(w)
            a = np.broadcast_to(address(w), (WAVE,))[act]
            apply = None
            if len(a):
                _check(w, a, nbytes, act, name, True, False)
                data = mem_read(a, nbytes)
                counters.global_load(a, nbytes)

                def apply():
                    _bytes_to_rows(w, row, data, act, nbytes, sext, d16)
            _deliver(w, "vm", dmask, apply)
        if "sc1" in inst.mods:  # multi-rank hook: a system-scope (flag) load, for hang reports (ranks.py)
            return ranks.watch_flag_load(h, address, _active)
        return h
    drow = row_of(data_op, acc)
    shift_hi = d16 == "hi"

    def h(w):
        act = _active(w)
        a = np.broadcast_to(address(w), (WAVE,))[act]
        if w.san is not None:
            _deliver(w, "vm", 0, None)
        if len(a):
            _check(w, a, nbytes, act, name, False, True)
            if shift_hi:
                regs = (w.v[drow, act] >> U32(16)).copy()
                data = regs.view(np.uint8).reshape(-1, 4)[:, :nbytes]
            else:
                data = _rows_to_bytes(w, drow, nbytes, act)
            mem_write(a, data)
            counters.global_store(a, nbytes)
    return h


def _global_atomic(inst, ctx, what, address, data_op, dst, returns):
    acc = ctx.acc_offset
    counters = ctx.counters
    x2 = what.endswith("_x2")
    if x2:
        return None  # 64-bit atomics: not used by our kernels yet
    drow = row_of(data_op, acc)
    rrow = row_of(dst, acc) if dst is not None else None
    rmask = _vmask(rrow, 1) if rrow is not None else 0
    row = ATOMIC32.get(what)
    if row is None and what != "cmpswap":
        return None
    op = row.fn if row is not None else None
    _atomic_rmw = ranks.system_rmw(inst, what) or _local_rmw  # multi-rank hook: sc1 = cross-process

    def h(w):
        act = _active(w)
        a = np.broadcast_to(address(w), (WAVE,))[act]
        _check(w, a, 4, act, inst.mnemonic, True, True)
        if what == "cmpswap":
            olds = _atomic_rmw(_global_read_one, _global_write_one, a, w.v[drow, act], None, cmp=w.v[drow + 1, act])
        else:
            olds = _atomic_rmw(_global_read_one, _global_write_one, a, w.v[drow, act], op)
        counters.global_atomic(a, 4)
        apply = None
        if rrow is not None:
            def apply():
                w.v[rrow, act] = olds
        _deliver(w, "vm", rmask, apply)
    return h


# ---- buffer (MUBUF) -----------------------------------------------------------------------------------

class BufferAddress:
    """Per-lane addresses and in-range masks from a MUBUF instruction's operands and its descriptor."""

    def __init__(self, inst, ops, acc):
        self.offen = "offen" in inst.mods
        self.idxen = "idxen" in inst.mods
        self.inst_offset = int(inst.mods.get("offset", "0"), 0)
        vaddr, srsrc, soffset = ops
        self.vread = raw_reader(vaddr, acc) if vaddr.kind != "off" else None
        self.vrow = row_of(vaddr, acc) if vaddr.is_vector else None
        self.rsrc = srsrc.index
        self.soff = scalar_reader(soffset)
        # how all_in_range_many reads soffset: an SGPR, or a constant (soff(w) of any wave)
        self.soff_sgpr = soffset.index if soffset.kind == "s" else None
        self.soff_const = self.soff(None) if soffset.kind == "const" else None
        self._get = None
        self._last = {}          # nbytes -> offsets of each dword's end, for the raw-buffer range check

    def compute(self, w, nbytes):
        """(addresses int64 (64,), per-lane range offset int64 (64,) or a Python int when the same for
        every lane, index int64 (64,) or 0, num_records, stride)."""
        s = w.s
        d0, d1, d2 = s[self.rsrc], s[self.rsrc + 1], s[self.rsrc + 2]
        base = d0 | ((d1 & 0xFFFF) << 32)
        stride = (d1 >> 16) & 0x3FFF
        num_records = d2
        soff = self.soff(w)
        if self.idxen:
            idx = w.v[self.vrow].astype(np.int64)
            off = self.inst_offset + w.v[self.vrow + 1].astype(np.int64) if self.offen else self.inst_offset
        else:
            idx = 0
            off = self.inst_offset + w.v[self.vrow].astype(np.int64) if self.offen else self.inst_offset
        # int64 (exact: every term is far below 2**63; every consumer works in int64)
        addr = base + soff + stride * idx + off
        if not isinstance(addr, np.ndarray):
            addr = np.full(WAVE, addr, np.int64)
        return addr, off + soff, idx, num_records, stride

    def all_in_range(self, w, nbytes):
        """The common case of compute + in_range in fewer steps: a raw buffer (stride 0, no idxen) with a
        per-lane offset where every lane's every dword is in range -> compute's int64 addresses; None
        otherwise (then use in_range). The in-range test is in_range's, taken at the largest offset."""
        if self.idxen or not self.offen:
            return None
        s = w.s
        d1 = s[self.rsrc + 1]
        if (d1 >> 16) & 0x3FFF:
            return None
        soff = self.soff(w)
        off = w.v[self.vrow].astype(np.int64)
        if self.inst_offset:
            off += self.inst_offset
        ndw = max(1, nbytes // 4)
        if int(off.max()) + soff + 4 * (ndw - 1) + min(4, nbytes) > s[self.rsrc + 2]:
            return None
        off += s[self.rsrc] | ((d1 & 0xFFFF) << 32)
        off += soff
        return off

    def all_in_range_many(self, waves, nbytes, lanes=False, idx=None):
        """all_in_range for a lockstep group at once: ((waves, 64) int64 addresses, (waves,) bool), the
        flag True where the wave has every lane active and all_in_range would return those addresses.
        lanes=True adds in_range's (waves, 64, ndw) in-range dwords, valid where the third value, (waves,)
        bool, is True (a raw buffer: stride 0), or None for both when every flag is True. idx: the waves'
        register slots (_slots), when the caller has them."""
        n = len(waves)
        if self.idxen or not self.offen:
            return (None, np.zeros(n, bool), None, np.zeros(n, bool)) if lanes else (None, np.zeros(n, bool))
        get = self._get
        if get is None:
            rs = self.rsrc
            get = self._get = (itemgetter(rs, rs + 1, rs + 2, self.soff_sgpr, EXEC_LO, EXEC_HI)
                               if self.soff_sgpr is not None else itemgetter(rs, rs + 1, rs + 2, EXEC_LO, EXEC_HI))
        # each wave's descriptor dwords 0-2, soffset and EXEC (all below 2**48): a Python int where every
        # wave holds one value (usual: compared in C), else an int64 array over the waves
        rows = [get(w.s) for w in waves]
        r0 = rows[0]
        cols = r0 if rows.count(r0) == n else [c[0] if c.count(c[0]) == n else np.array(c, np.int64)
                                                for c in zip(*rows)]
        if self.soff_sgpr is not None:
            d0, d1, d2, so, lo, hi = cols
        else:
            d0, d1, d2, lo, hi = cols
            so = self.soff_const
            if so is None:
                so = [self.soff(w) for w in waves]
                so = so[0] if so.count(so[0]) == n else np.array(so, np.int64)
        full = (lo == 0xFFFFFFFF) & (hi == 0xFFFFFFFF)
        raw = ((d1 >> 16) & 0x3FFF) == 0          # stride 0
        base = (d0 | ((d1 & 0xFFFF) << 32)) + so
        lim = d2 - so
        regs = waves[0].v.base
        if idx is None:
            idx = _slots(waves)
        off = regs[idx, self.vrow].astype(np.int64)
        if self.inst_offset:
            off += self.inst_offset
        ndw = max(1, nbytes // 4)
        reach = 4 * (ndw - 1) + min(4, nbytes)
        if type(lim) is int:
            if full is False or raw is False:
                ok = np.zeros(n, bool)
            elif int(off.max()) + reach <= lim:
                ok = full & np.ones(n, bool)
            else:
                ok = full & raw & (off.max(axis=1) + reach <= lim)
        else:
            ok = full & raw & (off.max(axis=1) + reach <= lim)
        if type(raw) is bool:
            raw = np.full(n, raw)
        dw = None
        if lanes and not ok.all():
            # in_range's test for a raw buffer (its offset there includes soffset, here in the limit)
            last = self._last.get(nbytes)
            if last is None:
                last = self._last[nbytes] = np.arange(0, 4 * ndw, 4, dtype=np.int64) + min(4, nbytes)
            dw = (off[:, :, None] + last) <= (lim if type(lim) is int else lim[:, None, None])
        off += base if type(base) is int else base[:, None]
        return (off, ok, dw, raw) if lanes else (off, ok)

    def in_range(self, w, nbytes):
        addr, off, idx, num_records, stride = self.compute(w, nbytes)
        ndw = max(1, nbytes // 4)
        if stride == 0 and not self.idxen:
            # UNSURE (gfx9 raw buffers): a dword is in range when its last byte is below num_records.
            last = self._last.get(nbytes)
            if last is None:
                last = self._last[nbytes] = np.arange(0, 4 * ndw, 4, dtype=np.int64) + min(4, nbytes)
            if isinstance(off, np.ndarray):
                return addr, (off[:, None] + last) <= num_records          # (64, ndw)
            ok = np.empty((WAVE, ndw), bool)
            ok[:] = (off + last) <= num_records
            return addr, ok
        ok = (np.asarray(idx) < num_records) & (np.asarray(off) - self.soff(w) < max(stride, 1))
        out = np.empty((WAVE, ndw), bool)
        out[:] = ok[:, None] if ok.ndim else ok
        return addr, out


def build_buffer(inst, ctx):
    m = re.match(r"buffer_(load|store|atomic)_(\w+)$", inst.mnemonic)
    if inst.mnemonic in ("buffer_wbl2", "buffer_inv", "buffer_wbinvl1", "buffer_wbinvl1_vol", "buffer_gl0_inv",
                         "buffer_gl1_inv"):
        return lambda w: None
    if not m:
        return None
    kind, what = m.group(1), m.group(2)
    ops = [parse_operand(o) for o in inst.operands]
    acc = ctx.acc_offset
    counters = ctx.counters
    lds = "lds" in inst.mods
    if lds and len(ops) == 3:
        data_op, addr_ops = None, ops
    else:
        data_op, addr_ops = ops[0], ops[1:4]
    ba = BufferAddress(inst, addr_ops, acc)
    if kind == "atomic":
        return _buffer_atomic(inst, ctx, what, ba, data_op)
    if what.startswith("format") or what not in SIZES:
        return None
    nbytes, sext, d16 = SIZES[what]
    ndw = max(1, nbytes // 4)

    if kind == "load" and lds:
        lds_off = ba.inst_offset

        def h(w):
            act = _active(w)
            addr, ok = ba.in_range(w, nbytes)
            a = addr[act]
            okl = ok[act]
            lanes = np.nonzero(act)[0]
            full = okl.all(axis=1)
            _check(w, a[full], nbytes, lanes[full], inst.mnemonic, True, False)
            safe = np.where(full, a, SAFE_ADDR)
            data = mem_read(safe, nbytes).reshape(-1, ndw, min(4, nbytes))
            data = np.where(okl[:, :, None], data, 0).reshape(-1, nbytes)
            # UNSURE: LDS destination = M0[17:0] + inst_offset + lane * size (gfx950 lds form).
            base = (w.s[M0] & 0x3FFFF) + lds_off
            dst = base + lanes * nbytes
            counters.global_load(a[full], nbytes)
            counters.lds_access(dst, nbytes, write=True)

            def apply():
                _lds_store_bytes(w, dst, data, ctx)
            _deliver(w, "vm", 0, apply, _race_rec(w, True, dst, nbytes))
        return h

    if kind == "load":
        row = row_of(data_op, acc)
        dmask = _vmask(row, nbytes // 4)

        def h(w):
            act = _active(w)
            a = ba.all_in_range(w, nbytes) if act is _ALL else None
            if a is not None:                # every lane active and in range (the usual case)
                _check(w, a, nbytes, act, inst.mnemonic, True, False)
                data = mem_read(a, nbytes)
                counters.global_load(a, nbytes)

                def apply():
                    _bytes_to_rows(w, row, data, act, nbytes, sext, d16)
                _deliver(w, "vm", dmask, apply)
                return
            addr, ok = ba.in_range(w, nbytes)
            a, okl = (addr, ok) if act is _ALL else (addr[act], ok[act])   # fresh arrays either way
            if not len(a):
                _deliver(w, "vm", dmask, None)
                return
            if okl.all():
                _check(w, a, nbytes, act, inst.mnemonic, True, False)
                data = mem_read(a, nbytes)
            else:
                lane_ok = okl.any(axis=1)
                # Lanes wholly in or wholly out of range (buffer bounds zero-filling padding rows) whose
                # in-range bytes pass the memory check as a whole: the per-dword checks would pass too.
                if w.san is not None and w.san.mem is not None and not (
                        (okl == lane_ok[:, None]).all()
                        and w.san.mem.clean_read(a[lane_ok], nbytes, 4 * (okl.shape[1] - 1))):
                    lanes = np.nonzero(act)[0]
                    for j in range(okl.shape[1]):
                        sel = okl[:, j]
                        _check(w, a[sel] + 4 * j, min(4, nbytes), lanes[sel], inst.mnemonic, True, False)
                safe = np.where(lane_ok, a, SAFE_ADDR)
                data = mem_read(safe, nbytes)
                if nbytes >= 4:
                    data = np.where(np.repeat(okl, 4, axis=1), data, 0).astype(np.uint8)
                else:
                    data = np.where(okl, data, 0).astype(np.uint8)
                a = a[lane_ok]
            counters.global_load(a, nbytes)

            def apply():
                _bytes_to_rows(w, row, data, act, nbytes, sext, d16)
            _deliver(w, "vm", dmask, apply)

        def group(waves):
            """Lockstep (lockstep.py): the group's loads in one gather, one memory check and one counter
            update: the same bytes, checks and counts as wave by wave. Waves whose every lane is active and
            in range read whole; the others (lanes outside EXEC or the buffer's bounds) read as h does,
            zero-filling the out-of-range dwords. The memory check runs first and only as a whole: if it
            reports, nothing has happened yet and the waves rerun one by one in the group's order, so the
            report is the first wave's, as alone. Each wave's registers are still delivered through its
            own queue: whole-dword loads of the waves with every lane active as shares of one GroupLoad
            (the group s_waitcnt stores them together), the others as closures."""
            idx = _slots(waves)
            many, whole, dw, raw = ba.all_in_range_many(waves, nbytes, lanes=True, idx=idx)
            if whole.all():
                fast, part = waves, ()
            else:
                fast, part = [], []
                for k, (w, f) in enumerate(zip(waves, whole.tolist())):
                    if f:
                        fast.append(w)
                    else:
                        s_ = w.s
                        full = s_[EXEC_LO] == 0xFFFFFFFF and s_[EXEC_HI] == 0xFFFFFFFF
                        act = _ALL if full else _active(w)
                        addr, ok = (many[k], dw[k]) if raw[k] else ba.in_range(w, nbytes)
                        part.append((w, act, addr, ok))
            a = (many.reshape(-1) if not part else many[whole].reshape(-1)) if fast else None
            if part:
                P = len(part)
                A = np.stack([p[2] for p in part]) if P > 1 else part[0][2][None]      # (P, 64) int64
                OK = np.stack([p[3] for p in part]) if P > 1 else part[0][3][None]     # (P, 64, ndw)
                if all(p[1] is _ALL for p in part):
                    eff, whole = OK, OK.all(axis=(1, 2))
                else:
                    ACT = np.stack([p[1] for p in part])[:, :, None]
                    eff, whole = OK & ACT, (OK | ~ACT).all(axis=(1, 2))
                # eff: the dwords read (active, in range); whole: h's okl.all() (checked as whole accesses)
                lane_ok = eff.any(axis=2)                                            # (P, 64)
            mem = waves[0].san.mem if waves[0].san is not None else None
            if mem is not None:
                try:
                    if fast:
                        mem.check(a, nbytes, _lane_tile(len(fast)), inst.mnemonic, True, False)
                    if part:
                        # whole where every active lane's every dword is in range (h checks those whole),
                        # else each in-range dword (what h checks, or finds clean)
                        if whole.any():
                            sel = lane_ok & whole[:, None]
                            mem.check(A[sel], nbytes, np.nonzero(sel)[1], inst.mnemonic, True, False)
                        if not whole.all():
                            pw = eff & ~whole[:, None, None]
                            for j in range(ndw):
                                sel = pw[:, :, j]
                                if sel.any():
                                    mem.check(A[sel] + 4 * j, min(4, nbytes), np.nonzero(sel)[1], inst.mnemonic,
                                              True, False)
                except Exception:
                    _one_by_one(h, waves)       # as alone: the first wave with a report raises it
                    return
            if not part:                # every wave whole (the usual case): one GroupLoad, one shared entry
                data = mem_read(a, nbytes)
                counters.global_load(a, nbytes)
                data = data.reshape(len(waves), WAVE, nbytes)
                if nbytes >= 4:         # whole dwords (no sign extension, no d16 half): rows as loaded
                    issue_group(waves, dmask, _dword_load(waves, idx, row, data))
                else:
                    issue_group(waves, dmask, None, [
                        lambda w=w, d=d: _bytes_to_rows(w, row, d, _ALL, nbytes, sext, d16)
                        for w, d in zip(waves, data)])
                return
            got = {}                    # id(wave) -> what its queue entry delivers (None: no lane active)
            whole_ws, whole_data = [], []       # waves with every lane active, their (n, 64, nbytes) bytes
            if fast:
                data = mem_read(a, nbytes)
                counters.global_load(a, nbytes)
                whole_ws += fast
                whole_data.append(data.reshape(len(fast), WAVE, nbytes))
            safe = np.where(lane_ok, A, SAFE_ADDR)
            data = mem_read(safe.reshape(-1), nbytes).reshape(P, WAVE, ndw, -1)
            if not eff.all():
                data = np.where(eff[:, :, :, None], data, 0).astype(np.uint8)
            data = data.reshape(P, WAVE, nbytes)
            counters.global_load(A[lane_ok], nbytes)
            for n, (w, act, _, _) in enumerate(part):
                if act is _ALL:
                    whole_ws.append(w)
                    whole_data.append(data[n][None])
                else:
                    got[id(w)] = (lambda w=w, d=data[n][act], act=act: _bytes_to_rows(
                        w, row, d, act, nbytes, sext, d16)) if act.any() else None
            if whole_ws:
                data = np.concatenate(whole_data) if len(whole_data) > 1 else whole_data[0]
                if nbytes >= 4:         # whole dwords (no sign extension, no d16 half): rows as loaded
                    load = _dword_load(whole_ws, _slots(whole_ws), row, data)
                    shares = [load] * len(whole_ws)     # an entry of each wave holding the GroupLoad
                else:
                    shares = [lambda w=w, d=d: _bytes_to_rows(w, row, d, _ALL, nbytes, sext, d16)
                              for w, d in zip(whole_ws, data)]
                got.update(zip(map(id, whole_ws), shares))
            # in the group's order, as alone (a missing wait reports naming its wave)
            issue_group(waves, dmask, None, [got[id(w)] for w in waves])
        h.group = group
        return h

    drow = row_of(data_op, acc)
    shift_hi = d16 == "hi"

    def h(w):
        act = _active(w)
        addr, ok = ba.in_range(w, nbytes)
        a, okl = (addr, ok) if act is _ALL else (addr[act], ok[act])   # fresh arrays either way
        if w.san is not None:
            _deliver(w, "vm", 0, None)
            if w.san.mem is not None:
                lanes = np.nonzero(act)[0]
                if okl.all():
                    _check(w, a, nbytes, lanes, inst.mnemonic, False, True)
                else:
                    for j in range(okl.shape[1]):
                        sel = okl[:, j]
                        _check(w, a[sel] + 4 * j, min(4, nbytes), lanes[sel], inst.mnemonic, False, True)
        if shift_hi:
            data = (w.v[drow, act] >> U32(16)).copy().view(np.uint8).reshape(-1, 4)[:, :nbytes]
        else:
            data = _rows_to_bytes(w, drow, nbytes, act)
        if not okl.all():
            lane_ok = okl.all(axis=1)
            if nbytes > 4 and (okl.any(axis=1) & ~lane_ok).any():
                # partially in-range wide stores: write the in-range dwords one by one
                for j in range(ndw):
                    sel = okl[:, j]
                    mem_write(a[sel] + 4 * j, data[sel, 4 * j: 4 * j + 4])
                    counters._stored_bytes.add(a[sel] + 4 * j, 4)
                counters.global_store_bytes += int(okl.sum()) * 4
                counters._stored.add(a[okl.any(axis=1)], nbytes)
                return
            a, data = a[lane_ok], data[lane_ok]
        if len(a):
            mem_write(a, data)
            counters.global_store(a, nbytes)

    def group(waves):
        """Lockstep (lockstep.py): one memory check, one scatter (waves in the group's order, then lanes, so
        a later wave wins where two overlap, as one by one) and one counter update over the lanes that
        store: active and in range. A raw buffer's lanes out of range (wholly: a lane with only some of its
        dwords in range runs the group wave by wave) are dropped, as alone. A memory report (out of bounds:
        found before any byte is marked written) reruns the group wave by wave, so it names the same wave."""
        idx = _slots(waves)
        many, whole, dw, raw = ba.all_in_range_many(waves, nbytes, lanes=True, idx=idx)
        n = len(waves)
        sel = None                  # (waves, 64) lanes that store, None when all of them
        if not whole.all():
            if not raw.all():
                _one_by_one(h, waves)
                return
            lane_ok = dw[:, :, 0] if ndw == 1 else dw.all(axis=2)
            if ndw > 1 and (dw.any(axis=2) & ~lane_ok).any():
                _one_by_one(h, waves)
                return
            sel = np.stack([_active(w) for w in waves]) & lane_ok
        a = many.reshape(-1) if sel is None else many[sel]
        mem = waves[0].san.mem if waves[0].san is not None else None
        if mem is not None and len(a):
            lanes = _lane_tile(n) if sel is None else np.nonzero(sel)[1]
            try:
                mem.check(a, nbytes, lanes, inst.mnemonic, False, True)
            except Exception:
                _one_by_one(h, waves)
                return
        issue_group(waves, 0, None)         # each wave's vmcnt entry (one shared: nothing to deliver)
        if not len(a):
            return
        regs = waves[0].v.base
        if shift_hi:
            data = (regs[idx, drow] >> U32(16)).view(np.uint8).reshape(n, WAVE, 4)[:, :, :nbytes]
        else:
            nd = (nbytes + 3) // 4
            data = regs[idx, drow: drow + nd].transpose(0, 2, 1).copy().view(np.uint8)[:, :, :nbytes]
        data = data.reshape(-1, nbytes) if sel is None else data[sel]
        mem_write(a, data)
        counters.global_store(a, nbytes)
    h.group = group
    return h


def _buffer_atomic(inst, ctx, what, ba, data_op):
    acc = ctx.acc_offset
    counters = ctx.counters
    returns = "sc0" in inst.mods or "glc" in inst.mods
    drow = row_of(data_op, acc)
    if what.endswith("_x2"):
        return None
    row = ATOMIC32.get(what)
    if row is None and what != "cmpswap":
        return None
    op = row.fn if row is not None else None
    _atomic_rmw = ranks.system_rmw(inst, what) or _local_rmw  # multi-rank hook: sc1 = cross-process

    def h(w):
        act = _active(w)
        addr, ok = ba.in_range(w, 4)
        sel = act & ok[:, 0]
        a = addr[sel]
        _check(w, a, 4, sel, inst.mnemonic, True, True)
        if what == "cmpswap":
            olds = _atomic_rmw(_global_read_one, _global_write_one, a, w.v[drow, sel], None, cmp=w.v[drow + 1, sel])
        else:
            olds = _atomic_rmw(_global_read_one, _global_write_one, a, w.v[drow, sel], op)
        counters.global_atomic(a, 4)
        apply = None
        if returns:
            def apply():
                w.v[drow, act] = 0
                w.v[drow, sel] = olds
        _deliver(w, "vm", _vmask(drow, 1) if returns else 0, apply)
    return h


# ---- LDS (DS) -----------------------------------------------------------------------------------------

def _lds_store_bytes(w, addrs, data, ctx):
    size = w.lds_size
    nbytes = data.shape[1]
    ok = (addrs >= 0) & (addrs + nbytes <= size)
    a = addrs[ok].astype(np.int64)
    if not len(a):
        return
    idx = a[:, None] + np.arange(nbytes)
    w.lds[idx] = data[ok]


def _lds_load_bytes(w, addrs, nbytes):
    size = w.lds_size
    a = addrs.astype(np.int64)
    ok = (a >= 0) & (a + nbytes <= size)
    idx = np.where(ok, a, 0)[:, None] + np.arange(nbytes)
    data = w.lds[np.minimum(idx, size - 1)] if size else np.zeros((len(a), nbytes), np.uint8)
    if not ok.all():
        data = np.where(ok[:, None], data, 0).astype(np.uint8)
    return data


def _ds_operands(inst, ctx):
    """(operands, acc offset, counters, byte offset) every DS builder starts from."""
    offset = int(inst.mods.get("offset", "0"), 0) if not str(inst.mods.get("offset", "0")).startswith("swizzle") else 0
    return [parse_operand(o) for o in inst.operands], ctx.acc_offset, ctx.counters, offset


def build_ds_swizzle(inst, ctx, kind):
    """ds_swizzle_b32: lanes read each other's register in a pattern (no LDS access)."""
    ops, acc, _, _ = _ds_operands(inst, ctx)
    src_lanes = swizzle_source_lanes(inst.mods.get("offset", "0"))
    drow, srow = row_of(ops[0], acc), row_of(ops[1], acc)

    dmask = _vmask(drow, 1)

    def h(w):
        act = _active(w)
        v = w.v[srow][src_lanes]
        v = np.where(act[src_lanes], v, U32(0))

        def apply():
            w.v[drow, act] = v[act]
        _deliver(w, "lds", dmask, apply)
    return h


def build_ds_permute(inst, ctx, kind):
    """ds_permute_b32 / ds_bpermute_b32: lane permutations through the LDS crossbar."""
    ops, acc, _, offset = _ds_operands(inst, ctx)
    drow, arow, srow = row_of(ops[0], acc), row_of(ops[1], acc), row_of(ops[2], acc)
    backward = inst.mnemonic == "ds_bpermute_b32"

    dmask = _vmask(drow, 1)

    def h(w):
        act = _active(w)
        lane = ((w.v[arow].astype(np.int64) + offset) >> 2) & 63
        if backward:
            out = np.where(act[lane], w.v[srow][lane], U32(0))
        else:
            out = np.zeros(WAVE, U32)
            src = np.nonzero(act)[0]
            out[lane[src]] = w.v[srow][src]

        def apply():
            w.v[drow, act] = out[act]
        _deliver(w, "lds", dmask, apply)

    def group(waves):
        """Lockstep, ds_bpermute under full EXEC: one gather over the group's lanes; each wave's result
        through its own queue, as alone (ds_permute, whose lanes collide, and partial EXEC: wave by wave)."""
        if not backward or any(w.s[EXEC_LO] != 0xFFFFFFFF or w.s[EXEC_HI] != 0xFFFFFFFF for w in waves):
            return _one_by_one(h, waves)
        regs = waves[0].v.base
        idx = _slots(waves)
        lane = ((regs[idx, arow].astype(np.int64) + offset) >> 2) & 63                     # (W, 64)
        load = GroupLoad(regs, idx, drow, np.take_along_axis(regs[idx, srow], lane, axis=1)[:, None, :])
        if waves[0].san is None:
            load.store()
            return
        for w, share in zip(waves, load.parts()):
            try:
                _deliver(w, "lds", dmask, share)
            except Exception as e:
                e.wave = w
                raise
    h.group = group
    return h


def build_ds_read_tr(inst, ctx, kind):
    """ds_read_b64_tr_b{4,8,16}."""
    ops, acc, counters, offset = _ds_operands(inst, ctx)
    m = re.match(r"ds_read_b64_tr_b(4|8|16)$", inst.mnemonic)
    return _ds_read_tr(inst, ctx, ops, offset, int(m.group(1)))


# ---- LDS group forms (lockstep.py) ---------------------------------------------------------------------
# The waves of a lockstep batch keep their LDS as rows of one (workgroups, bytes) array (engine.py), so a
# group's accesses, over several workgroups, are one gather or one scatter into it.

_BYTES = [np.arange(n) for n in range(17)]


_last_group: list = [None, None]    # (the waves, _lds_layout of them) of the last group: a group runs many


def _lds_layout(waves):
    """(register slots (W,), each wave's LDS row offset in the batch's flat LDS in bytes (W, 1, 1) and in
    dwords (W, 1, 1, 1), that array flat), or None when the waves' LDS are not rows of one batch array."""
    key = tuple(waves)
    if _last_group[0] == key:
        return _last_group[1]
    big = waves[0].lds.base
    layout = None
    if big is not None and big.ndim == 2 and all(w.lds.base is big for w in waves):
        rows = np.fromiter((w.wg.lds_row for w in waves), np.int64, len(waves)) * waves[0].lds_size
        layout = _slots(waves), rows[:, None, None], rows[:, None, None, None] >> 2, big.reshape(-1)
    _last_group[:] = key, layout
    return layout


_OFFSETS: dict = {}
_UNIT_TILES: dict = {}


def _offsets(offsets):
    """(the offsets as (K, 1) int64, are they all dword-aligned), per instruction form."""
    got = _OFFSETS.get(offsets)
    if got is None:
        o = np.array(offsets, np.int64)
        got = _OFFSETS[offsets] = o[:, None], not (o & 3).any()
    return got


def _dword_runs(d, ndw):
    """(..., ndw) int64: the ndw consecutive dword indices from each of d. A repeat and one flat add of
    tiled units: broadcasting onto a last axis of 2-4 is several times slower in numpy."""
    if ndw == 1:
        return d[..., None]
    key = (d.size, ndw)
    units = _UNIT_TILES.get(key)
    if units is None:
        units = _UNIT_TILES[key] = np.tile(_BYTES[ndw], d.size)
    return (np.repeat(d.reshape(-1), ndw) + units).reshape(d.shape + (ndw,))


class _LdsGroup:
    """A lockstep group's LDS access: register slots (W,), byte addresses in each wave's LDS `a` (W, K, 64),
    one per offset, and the batch's LDS array flat. When the access is whole aligned dwords (and the LDS
    rows are), one dword index per lane `dwords` (W, K, 64, ndw, in each wave's LDS) serves the gather or
    scatter and the race records."""

    __slots__ = ("slots", "a", "nbytes", "size", "row_bytes", "row_dwords", "flat", "dwords")

    def __init__(self, layout, base, offsets, nbytes, size):
        """base: the lanes' address registers (W, 64) uint32; offsets: the access's byte offsets (K)."""
        self.slots, self.row_bytes, self.row_dwords, self.flat = layout
        self.nbytes, self.size = nbytes, size
        column, offsets_aligned = _offsets(offsets)
        aligned = offsets_aligned and not (nbytes & 3 or size & 3 or np.bitwise_or.reduce(base, axis=None) & 3)
        self.a = base.astype(np.int64)[:, None, :] + column                            # (W, K, 64)
        self.dwords = _dword_runs(self.a >> 2, nbytes >> 2) if aligned else None

    def gather(self):
        """(W, K, 64, nbytes) uint8 LDS bytes."""
        if self.dwords is not None:
            return self.flat.view(U32).take(self.dwords + self.row_dwords).view(np.uint8)
        return self.flat[(self.a + self.row_bytes)[..., None] + _BYTES[self.nbytes]]

    def scatter(self, data):
        """Store (W, K, 64, nbytes) uint8 in C order (a later wave, offset or lane wins where two overlap, as
        wave by wave)."""
        if self.dwords is not None:
            self.flat.view(U32)[self.dwords + self.row_dwords] = np.ascontiguousarray(data).view(U32)
        else:
            self.flat[(self.a + self.row_bytes)[..., None] + _BYTES[self.nbytes]] = data

    def record(self, write):
        """lds_record of the group's addresses (every lane inside the LDS): (write, (W, -1) indices, unit)."""
        if self.dwords is not None:
            return write, self.dwords.reshape(len(self.slots), -1), 4
        return lds_record(write, self.a, self.nbytes, self.size, inside=True)


def _lds_group(waves, arow, offsets, nbytes):
    """The group's _LdsGroup, or None when the group runs wave by wave: a lane outside EXEC or an address
    outside the LDS (lanes that read 0 or are dropped alone), or waves whose LDS is not a row of one batch
    array."""
    for w in waves:
        s_ = w.s
        if s_[EXEC_LO] != 0xFFFFFFFF or s_[EXEC_HI] != 0xFFFFFFFF:
            return None
    layout = _lds_layout(waves)
    if layout is None:
        return None
    size = waves[0].lds_size
    base = waves[0].v.base[layout[0], arow]                                         # (W, 64) uint32
    if int(base.max()) + max(offsets) > size - nbytes:
        return None
    return _LdsGroup(layout, base, offsets, nbytes, size)


def _lds_deliver(waves, mask, shares, g, write):
    """Each wave's result (shares: a GroupLoad, one closure per wave, or None) and race record of the group
    access g through its own queue, in the group's order (as alone); without the sanitizer a GroupLoad is
    one store now."""
    if isinstance(shares, GroupLoad):
        if waves[0].san is None:
            shares.store()
            return
        shares = shares.parts()
    s0 = waves[0].san           # one batch, one set of detectors
    races = s0 is not None and s0.races is not None
    if races:
        _, idx, unit = g.record(write)
    for n, w in enumerate(waves):
        try:
            _deliver(w, "lds", mask, shares[n] if shares is not None else None,
                     (write, idx[n], unit) if races else None)
        except Exception as e:
            e.wave = w
            raise


def build_ds_pair(inst, ctx, kind):
    """ds_read2 / ds_write2 (st64) b32 / b64: two accesses at offset0 and offset1."""
    ops, acc, counters, offset = _ds_operands(inst, ctx)
    m = re.match(r"ds_(read2|write2)(st64)?_b(32|64)$", inst.mnemonic)
    size = int(m.group(3)) // 8
    scale = size * (64 if m.group(2) else 1)
    o0 = int(inst.mods.get("offset0", "0"), 0) * scale
    o1 = int(inst.mods.get("offset1", "0"), 0) * scale
    ndw = size // 4
    if m.group(1) == "read2":
        drow, arow = row_of(ops[0], acc), row_of(ops[1], acc)

        dmask = _vmask(drow, 2 * ndw)

        def h(w):
            act = _active(w)
            base = w.v[arow, act].astype(np.int64)
            got = []
            for k, o in enumerate((o0, o1)):
                got.append(_lds_load_bytes(w, base + o, size).view(U32).reshape(-1, ndw).T)
                counters.lds_access(base + o, size, write=False)

            def apply():
                for k in range(2):
                    w.v[drow + k * ndw: drow + (k + 1) * ndw, act] = got[k]
            _deliver(w, "lds", dmask, apply, _race_rec(w, False, np.concatenate([base + o0, base + o1]), size))

        def group(waves):
            """Lockstep: one gather over the group's workgroups; results delivered wave by wave."""
            g = _lds_group(waves, arow, (o0, o1), size)
            if g is None:
                return _one_by_one(h, waves)
            rows = g.gather().view(U32).transpose(0, 1, 3, 2).reshape(len(waves), 2 * ndw, WAVE)
            counters.lds_access_rows(g.a, size, write=False)
            _lds_deliver(waves, dmask, GroupLoad(waves[0].v.base, g.slots, drow, rows), g, False)
        h.group = group
        return h
    arow, r0, r1 = row_of(ops[0], acc), row_of(ops[1], acc), row_of(ops[2], acc)

    def h(w):
        act = _active(w)
        base = w.v[arow, act].astype(np.int64)
        for o, r in ((o0, r0), (o1, r1)):
            _lds_store_bytes(w, base + o, _rows_to_bytes(w, r, size, act), ctx)
            counters.lds_access(base + o, size, write=True)
        _deliver(w, "lds", 0, None, _race_rec(w, True, np.concatenate([base + o0, base + o1]), size))

    def group(waves):
        """Lockstep: one scatter over the group's workgroups (wave, then offset, then lane order, as wave
        by wave); race records delivered wave by wave."""
        g = _lds_group(waves, arow, (o0, o1), size)
        if g is None:
            return _one_by_one(h, waves)
        regs = waves[0].v.base
        data = np.stack([regs[g.slots, r0: r0 + ndw], regs[g.slots, r1: r1 + ndw]], axis=1)  # (W, 2, ndw, 64)
        g.scatter(np.ascontiguousarray(data.transpose(0, 1, 3, 2)).view(np.uint8))
        counters.lds_access_rows(g.a, size, write=True)
        if waves[0].san is not None:
            _lds_deliver(waves, 0, None, g, True)
    h.group = group
    return h


def build_ds_rw(inst, ctx, kind):
    """ds_read_* / ds_write_* of one size (d16 halves, sign extension)."""
    ops, acc, counters, offset = _ds_operands(inst, ctx)
    m = re.match(r"ds_(read|write)_(\w+)$", inst.mnemonic)
    nbytes, sext, d16 = SIZES[m.group(2)]
    if m.group(1) == "read":
        drow, arow = row_of(ops[0], acc), row_of(ops[1], acc)

        dmask = _vmask(drow, nbytes // 4)

        def h(w):
            act = _active(w)
            a = w.v[arow, act].astype(np.int64) + offset
            data = _lds_load_bytes(w, a, nbytes)
            counters.lds_access(a, nbytes, write=False)

            def apply():
                _bytes_to_rows(w, drow, data, act, nbytes, sext, d16)
            _deliver(w, "lds", dmask, apply, _race_rec(w, False, a, nbytes))

        def group(waves):
            """Lockstep: one gather over the group's workgroups; results delivered wave by wave."""
            g = _lds_group(waves, arow, (offset,), nbytes)
            if g is None:
                return _one_by_one(h, waves)
            data = g.gather()[:, 0]                                     # (W, 64, nbytes)
            counters.lds_access_rows(g.a, nbytes, write=False)
            if nbytes >= 4:             # whole dwords: one GroupLoad
                shares = _dword_load(waves, g.slots, drow, data)
            else:
                shares = [lambda w=w, d=data[k]: _bytes_to_rows(w, drow, d, _ALL, nbytes, sext, d16)
                          for k, w in enumerate(waves)]
            _lds_deliver(waves, dmask, shares, g, False)
        h.group = group
        return h
    arow, drow = row_of(ops[0], acc), row_of(ops[1], acc)
    hi = d16 == "hi"

    def h(w):
        act = _active(w)
        a = w.v[arow, act].astype(np.int64) + offset
        if hi:
            data = (w.v[drow, act] >> U32(16)).copy().view(np.uint8).reshape(-1, 4)[:, :nbytes]
        else:
            data = _rows_to_bytes(w, drow, nbytes, act)
        _lds_store_bytes(w, a, data, ctx)
        counters.lds_access(a, nbytes, write=True)
        _deliver(w, "lds", 0, None, _race_rec(w, True, a, nbytes))

    def group(waves):
        """Lockstep: one scatter over the group's workgroups (wave, then lane order, as wave by wave); race
        records delivered wave by wave."""
        g = _lds_group(waves, arow, (offset,), nbytes)
        if g is None:
            return _one_by_one(h, waves)
        regs = waves[0].v.base
        n = len(waves)
        if hi:
            data = (regs[g.slots, drow] >> U32(16)).view(np.uint8).reshape(n, 1, WAVE, 4)[..., :nbytes]
        else:
            nd = (nbytes + 3) // 4
            data = np.ascontiguousarray(regs[g.slots, drow: drow + nd].transpose(0, 2, 1)).view(np.uint8)
            data = data.reshape(n, 1, WAVE, 4 * nd)[..., :nbytes]
        g.scatter(data)
        counters.lds_access_rows(g.a, nbytes, write=True)
        if waves[0].san is not None:
            _lds_deliver(waves, 0, None, g, True)
    h.group = group
    return h


def build_ds_atomic(inst, ctx, kind):
    """LDS atomics (with or without _rtn), applied lane by lane."""
    name = inst.mnemonic
    ops, acc, counters, offset = _ds_operands(inst, ctx)
    m = re.match(r"ds_(\w+?)(_rtn)?_(u32|i32|f32|b32|pk_add_bf16|pk_add_f16)$", name)
    if name in ("ds_pk_add_bf16", "ds_pk_add_f16", "ds_pk_add_rtn_bf16", "ds_pk_add_rtn_f16"):
        op = ATOMIC32[name.replace("ds_", "").replace("_rtn", "")].fn
        rtn = "_rtn" in name
    elif m:
        key = f"{m.group(1)}_{m.group(3)}"
        row = ATOMIC32.get(key) or ATOMIC32.get(m.group(1))
        op = row.fn if row is not None else None
        rtn = bool(m.group(2)) or m.group(1) == "wrxchg"
        if m.group(1) == "wrxchg":
            op = ATOMIC32["swap"].fn
            rtn = True
        if op is None and m.group(1) not in ("cmpst", "cmpswap"):
            return None
    else:
        return None
    if rtn:
        drow, arow, vrow = row_of(ops[0], acc), row_of(ops[1], acc), row_of(ops[2], acc)
    else:
        drow, arow, vrow = None, row_of(ops[0], acc), row_of(ops[1], acc)

    def h(w):
        act = _active(w)
        a = w.v[arow, act].astype(np.int64) + offset
        lds32 = w.lds

        def rd(x):
            return int(lds32[x: x + 4].view(U32)[0]) if 0 <= x and x + 4 <= w.lds_size else 0

        def wr(x, v):
            if 0 <= x and x + 4 <= w.lds_size:
                lds32[x: x + 4].view(U32)[0] = v
        olds = _atomic_rmw(rd, wr, a, w.v[vrow, act], op)
        counters.lds_access(a, 4, write=True)
        apply = None
        if drow is not None:
            def apply():
                w.v[drow, act] = olds
        # LDS atomics are not race-recorded: waves may legitimately update one counter concurrently
        _deliver(w, "lds", _vmask(drow, 1) if drow is not None else 0, apply)
    return h


def _ds_read_tr(inst, ctx, ops, offset, bits):
    """ds_read_b64_tr_b{4,8,16} (gfx950): a transposing LDS read for MFMA operands; the lane mapping and
    its evidence are in mfma.ds_read_tr_sources."""
    acc = ctx.acc_offset
    counters = ctx.counters
    drow, arow = row_of(ops[0], acc), row_of(ops[1], acc)

    dmask = _vmask(drow, 2)

    def h(w):
        act = _active(w)
        a = w.v[arow].astype(np.int64) + offset
        res = mfma.ds_read_tr(bits, _lds_load_bytes(w, a, 8)).view(U32)   # (64, 2) dwords per lane
        if act is not _ALL:
            a = a[act]
        counters.lds_access(a, 8, write=False)

        def apply():
            if act is _ALL:
                w.v[drow: drow + 2] = res.T
            else:
                w.v[drow: drow + 2, act] = res[act].T
        _deliver(w, "lds", dmask, apply, _race_rec(w, False, a, 8))

    def group(waves):
        """Lockstep: one gather over the group's workgroups and one transpose over the wave axis; results
        and race records delivered wave by wave (partial EXEC or an address outside the LDS: wave by wave)."""
        g = _lds_group(waves, arow, (offset,), 8)
        if g is None:
            return _one_by_one(h, waves)
        res = mfma.ds_read_tr(bits, g.gather()[:, 0]).view(U32)                   # (W, 64, 2)
        counters.lds_access_rows(g.a, 8, write=False)
        _lds_deliver(waves, dmask, GroupLoad(waves[0].v.base, g.slots, drow, res.transpose(0, 2, 1)), g, False)
    h.group = group
    return h
