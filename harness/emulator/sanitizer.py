"""The emulator as a sanitizer: missing waits, MFMA read-too-early hazards, LDS races and memory checking.

Turned on per launch by `emulator.options(sanitize=True, memory=guard)` (the harness does it for every case).
Every report raises SanitizerError, which the engine turns into a SanitizerReport (a LaunchError) naming the
kernel, workgroup, wave, PC and instruction; lanes and addresses are in the message.

Deferred completion (detector "waits"). A vector-memory load (global/flat/buffer, also the LDS-direct
`buffer_load ... lds`), an LDS access and a scalar load reads memory when it issues but delivers its result
(registers, or LDS bytes for the LDS-direct form / race bookkeeping) only when an s_waitcnt that covers it
executes. The counting rules, as LLVM's SIInsertWaitcnts.cpp models gfx9 without a separate store counter:
  - vmcnt: loads and stores share one counter and complete in issue order ("On targets without VScnt,
    LOAD_CNT includes all of STORE_CNT as well ... do not go out of order with respect to each other",
    WaitcntBrackets::counterOutOfOrder). vmcnt(N) completes all but the newest N.
  - lgkmcnt: LDS operations complete in order among themselves; "Scalar memory read always can go out of
    order" (counterOutOfOrder), so lgkmcnt(N) with N > 0 guarantees no scalar load, and guarantees every LDS
    operation except the newest N (the file header: "when both SMEM and LDS are in flight and we need to wait
    for the i-th-last LDS instruction, then an lgkmcnt(i) is actually sufficient"). lgkmcnt(0) completes all.
  - expcnt counts exports and GDS only on gfx9 (vmemWriteNeedsExpWaitcnt() is false after SEA_ISLANDS):
    nothing our kernels issue. FLAT is modelled as vmcnt only (no kernel of ours issues flat_*).
Reading or writing a register whose load is outstanding is a missing wait. A second load into a register
with an outstanding load of the same in-order queue (vm after vm, LDS after LDS) is legal (LLVM emits no
wait for it); any other overlap is reported.

MFMA hazards (detector "hazards"). The CDNA3 ISA's table "VOP3P-Matrix opcodes required NOPs" (LLVM
GCNHazardRecognizer::checkMAIVALUHazards / checkMAIHazards90A, GFX940_XDL_N_Pass* helpers): after an XDL
MFMA of P passes writes VGPRs, a VALU that reads or writes them, or a VMEM/DS that reads them, needs P+3
wait states; another MFMA reading them as SrcA/B needs P+3, as an overlapping (not identical) SrcC P+1;
an identical SrcC needs none (2 for 2-pass). Each instruction is one wait state, s_nop N is N+1. These are
the CDNA3 (gfx940) numbers; newer LLVM adds one wait state on gfx950 for some rows, so the detector may miss
a hazard that is one wait state short on gfx950. Pass counts come from each MFMA's FLOPs and the published
per-format rates (mfma_passes).

LDS races (detector "races"). An access completing in the same barrier epoch as a conflicting access of
another wave of its workgroup (write/read, read/write, write/write on one byte) is a race. Accesses are
recorded when they complete, so an LDS write not waited for before s_barrier belongs to the epoch after it,
and checked when the epoch ends (LdsShadow); a race found then is reported as if each access had been
checked as it completed (the same text, naming the instruction it completed at: for an access completed by
the drain at a wave's end, its s_endpgm), and before any error raised later in the epoch. A workgroup of one
wave cannot race and keeps no records.

Inactive lanes (detector "lanes"). `v_readlane_b32` reads one lane whatever EXEC holds. Where the VGPR it
reads was written after the latest EXEC write on the straight-line path to it (no branch target between:
`stale_readlanes`), that write ran under the EXEC the readlane sees; a lane outside it kept whatever the
register held before, a value LLVM treats as undefined (its machine sinking may move the last step of a wave
scan into a lane-0 branch: stop 44's quant_sort bug). Reading such a lane is reported.

Memory checking: see MemoryMap.
"""

from __future__ import annotations

import itertools
import re
from bisect import bisect_right
from collections import deque

import numpy as np

from .operands import parse_operand, scalar_reader
from .state import EXEC_HI, EXEC_LO

VBASE = 128        # register-slot bit of VGPR row 0 (SGPRs take bits 0..127)


class SanitizerError(RuntimeError):
    def __init__(self, kind: str, message: str):
        super().__init__(f"[{kind}] {message}")
        self.kind = kind


ALL_DETECTORS = frozenset({"waits", "hazards", "races", "interleave", "lanes"})


def detectors(spec) -> frozenset:
    if not spec:
        return frozenset()
    if spec is True:
        return ALL_DETECTORS
    return frozenset(spec)


# ---- register masks -----------------------------------------------------------------------------------

def op_mask(tok: str, acc: int) -> int:
    try:
        op = parse_operand(tok)
    except Exception:  # noqa: BLE001 - labels, waitcnt text: no register
        return 0
    if op.kind == "s":
        if op.index >= VBASE:
            return 0
        return ((1 << op.count) - 1) << op.index
    if op.kind in ("v", "a"):
        row = op.index + (acc if op.kind == "a" else 0)
        return ((1 << op.count) - 1) << (VBASE + row)
    return 0


def reg_names(mask: int, acc: int) -> str:
    out = []
    i = 0
    while mask:
        if mask & 1:
            out.append(f"s{i}" if i < VBASE else (f"v{i - VBASE}" if i - VBASE < acc else f"a{i - VBASE - acc}"))
        mask >>= 1
        i += 1
    return ",".join(out[:8]) + ("..." if len(out) > 8 else "")


def _load_dst(inst) -> bool:
    """True when operand 0 of this memory instruction is a destination written at completion."""
    m = inst.mnemonic
    if m.startswith(("s_load", "s_buffer_load")):
        return True
    if m.startswith(("global_load", "flat_load", "scratch_load")):
        return True
    if m.startswith("buffer_load"):
        return not ("lds" in inst.mods and len(inst.operands) == 3)
    if m.startswith(("global_atomic", "flat_atomic", "buffer_atomic")):
        return "sc0" in inst.mods or "glc" in inst.mods
    if m.startswith("ds_"):
        return m.startswith(("ds_read", "ds_swizzle", "ds_permute", "ds_bpermute")) or "_rtn" in m
    return False


def is_memory(m: str) -> bool:
    return m.startswith(("s_load", "s_buffer_load", "global_", "flat_", "scratch_", "buffer_", "ds_"))


# Dense MFMA rates on MI355X per SIMD per clock (GFX950.md: per CU 4096 bf16, 8192 fp8, 16384 fp6/fp4).
_FLOP_PER_CLOCK = {"bf16": 1024, "f16": 1024, "f32": 256, "xf32": 512, "i8": 2048, "fp8": 2048, "fp4": 4096}


def mfma_passes(inst) -> int:
    """Passes (4 clocks each) of an XDL MFMA: its FLOPs over the chip's published rate for its operand
    formats, the slower operand deciding. Cross-check: LLVM 22 separates a v_mfma_f32_16x16x32_bf16 from
    a VALU read of its result by 10 wait states, which fits 4 passes (needs 7), not 8 (needs 11).
    UNSURE: whether the older forms (16x16x16 bf16, 16x16x32 fp8) run at gfx950's doubled rates; assuming
    they do gives the smaller pass count, so the detector may miss a hazard but never reports valid code."""
    m = inst.mnemonic
    dims = re.search(r"_(\d+)x(\d+)x(\d+)", m)
    if dims is None:
        raise ValueError(f"{m}: no MxNxK in the MFMA mnemonic")
    flops = 2 * int(dims.group(1)) * int(dims.group(2)) * int(dims.group(3))
    if "f8f6f4" in m:
        codes = (int(inst.mods.get("cbsz", "0"), 0), int(inst.mods.get("blgp", "0"), 0))
        kind = "fp8" if min(codes) < 2 else "fp4"  # codes 0-1: FP8/BF8, 2-4: FP6/BF6/FP4 (FP6 runs at FP4 rate)
    elif re.search(r"(fp8|bf8)", m):
        kind = "fp8"
    else:
        kind = next((k for k in ("xf32", "bf16", "f16", "i8", "f32") if m.endswith(k) or f"_{k}_" in m), "f32")
    return max(2, flops // _FLOP_PER_CLOCK[kind] // 4)


class StaticInfo:
    """Per-instruction tables for a program: register masks, wait states, hazard classes."""

    def __init__(self, program, acc: int):
        n = len(program.table)
        self.touch = [0] * n          # registers checked against outstanding loads before issue
        self.dst = [0] * n            # registers a memory instruction delivers at completion
        self.wait_states = [1] * n
        self.hz = [None] * n          # hazard class: 'valu', 'mem', ('mfma', a|b mask, c mask)
        self.hz_reads = [0] * n       # the registers a hazard of its class can involve (0: none)
        self.acc = acc
        for inst in program.insts.values():
            i = (inst.pc - program.base) >> 2
            m = inst.mnemonic
            masks = [op_mask(t, acc) for t in inst.operands]
            allm = 0
            for x in masks:
                allm |= x
            if is_memory(m):
                if _load_dst(inst) and masks:
                    self.dst[i] = masks[0]
                    src = 0
                    # buffer atomics with return read their data from the destination registers
                    for x in (masks if m.startswith("buffer_atomic") else masks[1:]):
                        src |= x
                    self.touch[i] = src
                else:
                    self.touch[i] = allm
                self.hz[i] = "mem"
                self.hz_reads[i] = self.touch[i]
            else:
                self.touch[i] = allm
                if m.startswith(("v_mfma", "v_smfmac")):
                    ab = 0
                    for x in masks[1:3] + masks[4:]:
                        ab |= x
                    self.hz[i] = ("mfma", ab, masks[3] if len(masks) > 3 else 0)
                    self.hz_reads[i] = ab | self.hz[i][2]
                elif m.startswith("v_"):
                    self.hz[i] = "valu"
                    self.hz_reads[i] = allm
            if m == "s_nop":
                self.wait_states[i] = (inst.words[0] & 0xF) + 1 if inst.words else 1


def _writes_exec(inst) -> bool:
    m = inst.mnemonic
    return ("saveexec" in m or "wrexec" in m or m.startswith("v_cmpx")
            or bool(inst.operands) and inst.operands[0] in ("exec", "exec_lo", "exec_hi"))


def _ends_path(inst) -> bool:
    return inst.mnemonic in ("s_branch", "s_endpgm", "s_setpc_b64", "s_swappc_b64")


def _vgpr_rows(mask: int) -> range:
    rows = mask >> VBASE
    if not rows:
        return range(0)
    low = (rows & -rows).bit_length() - 1
    return range(low, rows.bit_length())


def stale_readlanes(program, acc: int) -> dict:
    """index -> (writer pc, VGPR row) for each v_readlane_b32 whose source VGPR was last written after the
    latest EXEC write on the straight-line path to it (no branch target in between) by an instruction that
    writes under EXEC (a VALU or a load). An MFMA write clears the row (all lanes); v_writelane (one lane,
    whatever EXEC) leaves it as it was, so a read of the very lane it wrote, outside EXEC, would be reported.
    Where unsure it leaves a readlane out (a miss, not a false report): an instruction with exec as operand 0
    counts as an EXEC write even when it only reads it (s_cmp), and second destinations (v_swap) are not followed. A program with
    s_setpc_b64 (a long branch: its targets are not in the encoding) gets no candidates."""
    from .ops_scalar import _branch_target

    insts = sorted(program.insts.values(), key=lambda x: x.pc)
    if any(x.mnemonic == "s_setpc_b64" for x in insts):
        return {}
    targets = {_branch_target(x) for x in insts
               if x.mnemonic == "s_branch" or x.mnemonic.startswith("s_cbranch")}
    out = {}
    written: dict[int, int] = {}      # VGPR row -> pc of its last write since the path's latest EXEC write
    for inst in insts:
        if inst.pc in targets:
            written.clear()
        m = inst.mnemonic
        if m == "v_readlane_b32" and len(inst.operands) > 1:
            for row in _vgpr_rows(op_mask(inst.operands[1], acc)):
                if row in written:
                    out[(inst.pc - program.base) >> 2] = (written[row], row)
        if _writes_exec(inst) or _ends_path(inst):
            written.clear()
            continue
        if not inst.operands or m.startswith(("v_writelane", "v_readlane", "v_readfirstlane", "v_cmp")):
            continue
        if not (m.startswith("v_") or (is_memory(m) and _load_dst(inst) and "load_lds" not in m)):
            continue
        rows = _vgpr_rows(op_mask(inst.operands[0], acc))
        if m.startswith(("v_mfma", "v_smfmac")):
            for row in rows:
                written.pop(row, None)
        else:
            for row in rows:
                written[row] = inst.pc
    return out


def waitcnt_fields(inst) -> tuple[int, int]:
    """(vmcnt, lgkmcnt) of a gfx9 s_waitcnt from its SIMM16 (vm[3:0]|vm_hi[15:14], lgkm[11:8])."""
    s = inst.words[0] & 0xFFFF
    return (s & 0xF) | (((s >> 14) & 3) << 4), (s >> 8) & 0xF


# ---- memory map: reachable tensors and poison ---------------------------------------------------------

def _lane_numbers(lanes) -> np.ndarray:
    """Lane numbers from a bool lane mask or an array of lane numbers (masks are converted only when
    needed: for a report or a multi-range access)."""
    lanes = np.asarray(lanes)
    return np.nonzero(lanes)[0] if lanes.dtype == bool else lanes


_DWORD_UNITS = [np.arange(n) for n in range(17)]


class MemoryMap:
    """Byte ranges a launch may touch, and which bytes of fresh tensors have been written.

    ranges: (start, end, name, poisoned) with poisoned ranges carrying a uint8 'written' byte map (1 = written
    by the host after creation or by a kernel store). Lookups are vectorised (searchsorted over sorted starts).
    """

    def __init__(self, ranges):
        ranges = sorted(ranges, key=lambda r: r[0])
        self.names = [r[2] for r in ranges]
        self.starts = np.array([r[0] for r in ranges], np.int64)
        self.ends = np.array([r[1] for r in ranges], np.int64)
        self.shadows = [r[3] for r in ranges]          # None or uint8 array over [start, end)
        self._start_list = [int(r[0]) for r in ranges]   # for bisect in check's one-range fast path
        self._end_list = [int(r[1]) for r in ranges]
        self._sh32 = [None] * len(ranges)               # uint32 views of the shadows, made when first used

    def _locate(self, a: np.ndarray, nbytes: int):
        idx = np.searchsorted(self.starts, a, side="right") - 1
        ok = idx >= 0
        idxc = np.maximum(idx, 0)
        ok &= (a + nbytes) <= self.ends[idxc] if len(self.ends) else False
        return ok, idxc

    def check(self, a, nbytes: int, lanes, what: str, read: bool, write: bool):
        """Raise for any address outside every range or any poisoned byte read; mark written bytes.
        `lanes`: the lane of each address, or the bool mask of those lanes."""
        if not len(a):
            return
        a = np.asarray(a, np.int64)
        # Fast path, the usual case: the lowest and the highest address locate the same range and the
        # highest access ends inside it. Locating is monotone in the address, so every lane then locates
        # that range and is inside it: exactly what _locate would find, without the per-lane search.
        lo, hi = int(a.min()), int(a.max())
        r = bisect_right(self._start_list, lo) - 1
        if r >= 0 and hi + nbytes <= self._end_list[r] and bisect_right(self._start_list, hi) - 1 == r:
            sh = self.shadows[r]
            if sh is not None:
                self._shadow(sh, r, a, nbytes, lanes, what, read, write)
            return
        lanes = _lane_numbers(lanes)
        ok, idx = self._locate(a, nbytes)
        if not ok.all():
            j = int(np.argmin(ok))
            raise SanitizerError(
                "out-of-bounds", f"{what} of {nbytes} bytes at address {int(a[j]):#x} (lane {int(lanes[j])}) "
                f"is inside no tensor the launch can reach{self._near(int(a[j]))}")
        for r in np.unique(idx).tolist():
            sh = self.shadows[r]
            if sh is None:
                continue
            sel = idx == r
            self._shadow(sh, r, a[sel], nbytes, np.asarray(lanes)[sel], what, read, write)

    def clean_read(self, a, nbytes: int, last: int) -> bool:
        """True when reading [a, a + nbytes) in pieces starting at a .. a + last (check() per piece)
        would report nothing: every piece locates one range, fits in it and reads only written bytes.
        No side effects; callers fall back to the piecewise checks (and their reports) when False."""
        a = np.asarray(a, np.int64)
        if not len(a):
            return True
        lo, hi = int(a.min()), int(a.max())
        r = bisect_right(self._start_list, lo) - 1
        if r < 0 or hi + nbytes > self._end_list[r] or bisect_right(self._start_list, hi + last) - 1 != r:
            return False
        sh = self.shadows[r]
        return sh is None or bool(sh[(a - self.starts[r])[:, None] + np.arange(nbytes)].all())

    def _shadow(self, sh, r, a, nbytes, lanes, what, read, write):
        """Written-byte map of fresh range r: report a read of a never-written byte, mark written ones."""
        if not nbytes & 3 and not self._start_list[r] & 3 and not (a & 3).any():
            # whole aligned dwords: four map bytes at once (a map byte is 0 or 1: 0x01010101 = all written)
            sh32 = self._sh32[r]
            if sh32 is None:
                sh32 = self._sh32[r] = sh[: len(sh) & ~3].view(np.uint32)
            i = (a - self._start_list[r]) >> 2
            if nbytes > 4:
                i = i[:, None] + _DWORD_UNITS[nbytes >> 2]
            if not read or (sh32[i] == 0x01010101).all():
                if write:
                    sh32[i] = 0x01010101
                return
        off = (a - self.starts[r])[:, None] + np.arange(nbytes)
        if read:
            bad = sh[off] == 0
            if bad.any():
                j, b = np.argwhere(bad)[0]
                lane = int(_lane_numbers(lanes)[j])
                raise SanitizerError(
                    "uninitialized", f"{what} reads never-written byte {int(a[j]) + int(b):#x} "
                    f"(offset {int(off[j, b])} of fresh tensor {self.names[r]}) in lane {lane}")
        if write:
            sh[off] = 1

    def _near(self, addr: int) -> str:
        if not len(self.starts):
            return " (no tensors recorded)"
        j = int(np.argmin(np.minimum(np.abs(self.starts - addr), np.abs(self.ends - addr))))
        return f"; nearest: {self.names[j]} [{int(self.starts[j]):#x}, {int(self.ends[j]):#x})"


# ---- LDS race shadow ----------------------------------------------------------------------------------

_RACE_SEQ = itertools.count()   # orders the race records of every workgroup (the earliest race reports)
_UNITS = [np.arange(n) for n in range(17)]


def lds_record(write: bool, a, nbytes: int, size: int, inside: bool = False):
    """The race record (write, indices, unit) of an access of nbytes at each byte address of `a` (any shape;
    the indices follow it in C order, then byte order) in an LDS of `size` bytes: dword indices (unit 4)
    when the access is whole aligned dwords, else byte indices (unit 1). Lanes not wholly inside the LDS
    are left out, as the access drops them (ops_memory._lds_store_bytes / _lds_load_bytes); `inside`: the
    caller knows every lane is inside. The indices are 2-D (a's first axis, the rest) when `a` is, else
    1-D."""
    a = np.asarray(a, np.int64)
    if not inside and a.size and (int(a.min()) < 0 or int(a.max()) + nbytes > size):
        a = a[(a >= 0) & (a + nbytes <= size)]
    shape = (len(a), -1) if a.ndim > 1 else (-1,)
    if not nbytes & 3 and not (a & 3).any():
        return write, ((a >> 2)[..., None] + _UNITS[nbytes >> 2]).reshape(shape), 4
    return write, (a[..., None] + _UNITS[nbytes]).reshape(shape), 1


CHECK_AT = 4096     # records of one epoch before LdsShadow checks it early (then at every doubling)


class LdsShadow:
    """One workgroup's LDS accesses of the current barrier epoch, checked for races when it ends.

    One wave's access after another, a race is an access that touches a byte another wave wrote, or (a
    write) read, earlier in the epoch (_Replay: the form each access was checked in when it completed).
    Such an access exists exactly when the epoch has a byte touched by two waves with a write among them,
    which needs no order: every write stamps its wave into `owner` (one byte per LDS byte; a dword record
    stamps four through the uint32 view) and must find its own stamp after all of them (two writers of a
    byte: one finds the other's), every read must find none or its own. So the records wait for the end of
    the epoch (end_epoch: the barrier, the workgroup's end, or another report) and cost one or two passes
    each; only a race is replayed one by one, to report the access the one-by-one check stops at, with the
    same byte and waves, and the first record of all workgroups' races (records are numbered across
    them)."""

    def __init__(self, size: int):
        self.size = size
        self.owner = np.zeros((size + 3) & ~3, np.uint8)    # wave + 1 of this epoch's writer; 0: none
        self._views = (None, self.owner, None, None, self.owner.view(np.uint32))
        self.pending = []   # (seq, wave id, write, indices, unit, WaveSan or None, access pc, completing pc)
        self.check_at = CHECK_AT

    def record(self, wave: int, write: bool, idx: np.ndarray, unit: int, san=None, pc: int = 0, where: int = 0):
        """Keep one wave's access (indices of `unit` bytes inside the LDS, from lds_record); `san` and `pc`
        name the access in a report, `where` the instruction it completed at. A long epoch is checked as it
        grows (every doubling from CHECK_AT records), so a race that leads to a spin (an LDS flag never
        seen) is still reported: the first race of a prefix is the epoch's first."""
        if idx.size:
            pending = self.pending
            pending.append((next(_RACE_SEQ), wave, write, idx, unit, san, pc, where))
            if len(pending) >= self.check_at:
                self.check_at *= 2
                race = self._check(pending)
                if race is not None:
                    self.pending = []
                    raise race

    def end_epoch(self):
        """Check the epoch's records and start the next epoch: the report (a SanitizerError with .seq,
        .race_wave and .at_pc) of the first access that races, or None."""
        recs = self.pending
        self.pending = []
        self.check_at = CHECK_AT
        return self._check(recs) if recs else None

    def _check(self, recs):
        """The report of the first of `recs` that races, or None. The records of one kind and unit are
        checked together (which writer's stamp survives on a byte two waves write does not matter: the
        other's differs)."""
        writes = ([], [], [], [], [])           # per unit: the write records
        reads = ([], [], [], [], [])
        writers = set()
        for r in recs:
            if r[2]:
                writes[r[4]].append(r)
                writers.add(r[1])
            else:
                reads[r[4]].append(r)
        if not writers:
            return None                         # reads alone never race
        views = self._views
        stamped = []
        for u in (4, 1):
            ws = writes[u]
            if ws:
                idx = ws[0][3] if len(ws) == 1 else np.concatenate([r[3] for r in ws])
                stamps = np.array([r[1] + 1 for r in ws], _STAMP[u]) * _SPREAD[u]
                code = np.repeat(stamps, [r[3].size for r in ws])
                views[u][idx] = code
                stamped.append((u, idx, code))
        race = False
        if len(writers) > 1:
            race = any((views[u][idx] != code).any() for u, idx, code in stamped)
        if not race:
            lone = next(iter(writers)) if len(writers) == 1 else -1      # a lone writer's reads see only it
            for u in (4, 1):
                rs = reads[u] if lone < 0 else [r for r in reads[u] if r[1] != lone]
                if not rs:
                    continue
                o = views[u][rs[0][3] if len(rs) == 1 else np.concatenate([r[3] for r in rs])]
                if not o.any():
                    continue                    # no read of a byte written in the epoch
                # each read's units against its own wave's stamp (reads of its own writes are no race); a dword
                # neither clear nor wholly its own (bytes of several writers) is checked byte by byte
                own = np.repeat(np.array([r[1] + 1 for r in rs], _STAMP[u]) * _SPREAD[u], [r[3].size for r in rs])
                odd = (o != 0) & (o != own)
                if odd.any():
                    o, own = o[odd].view(np.uint8), own[odd].view(np.uint8)
                    if ((o != 0) & (o != own)).any():
                        race = True
                        break
        for u, idx, _ in stamped:
            views[u][idx] = 0
        return _Replay(self.size).first_race(recs) if race else None


_STAMP = (None, np.uint8, None, None, np.uint32)        # a record's stamp per unit (LdsShadow.owner's views)
_SPREAD = (None, 1, None, None, 0x01010101)             # wave + 1 in each byte of a dword


class _Replay:
    """The epoch's records one by one, each checked as it completes against the earlier ones: per byte the
    last writer and the waves that read it."""

    def __init__(self, size: int):
        self.w_wave = np.full(size, -1, np.int16)
        self.r_mask = np.zeros(size, np.uint64)

    def first_race(self, recs):
        for seq, wave, write, idx, unit, san, pc, where in recs:
            if unit == 4:
                idx = (idx[:, None] * 4 + _UNITS[4]).ravel()
            e = self.access(wave, idx, write, _name(san, pc))
            if e is not None:
                e.seq, e.race_wave, e.at_pc = seq, san.wave if san is not None else None, where
                return e
        raise AssertionError("end_epoch found a race that one-by-one checking does not")

    def access(self, wave: int, idx: np.ndarray, write: bool, what: str):
        """Record one access (byte indices); the report if a byte was written by another wave earlier in the
        epoch, or (a write) read by one, else None."""
        w_wave = self.w_wave
        other_w = (w_wave[idx] != -1) & (w_wave[idx] != wave)
        bit = np.uint64(1 << wave)
        if write:
            other_r = (self.r_mask[idx] & ~bit) != 0
            bad = other_w | other_r
            if bad.any():
                j = int(np.argmax(bad))
                if other_w[j]:
                    who = f"written by wave {int(w_wave[idx[j]])}"
                else:
                    m = int(self.r_mask[idx[j]]) & ~(1 << wave)
                    who = f"read by wave {(m & -m).bit_length() - 1}"
                return SanitizerError("lds-race", f"{what} writes LDS byte {int(idx[j])}, {who} with no "
                                                  f"s_barrier in between")
            w_wave[idx] = wave
            return None
        if other_w.any():
            j = int(np.argmax(other_w))
            return SanitizerError("lds-race", f"{what} reads LDS byte {int(idx[j])}, written by wave "
                                              f"{int(w_wave[idx[j]])} with no s_barrier in between")
        self.r_mask[idx] |= bit
        return None


def _name(san, pc) -> str:
    return f"'{san._text(pc)}' (pc {pc:#x})" if san is not None else f"pc {pc:#x}"


def earliest_race(shadows, found=None):
    """End the epochs of a batch's workgroups (their shadows): the report of the earliest race among them and
    `found` (a report end_epoch gave), or None."""
    races = [r for r in (sh.end_epoch() for sh in shadows) if r is not None]
    if found is not None and hasattr(found, "seq"):
        races.append(found)
    return min(races, key=_seq_of) if races else None


def _seq_of(e):
    return e.seq


# ---- group loads (lockstep) ---------------------------------------------------------------------------

_LOAD_SEQ = itertools.count()


class GroupLoad:
    """The registers one lockstep group load delivers: wave k (register slot slots[k] of the batch's
    register file `regs`) gets rows [row, row + n) = data[k] ((W, n, 64) uint32). Each wave's queue entry
    holds its share, so it is delivered at that wave's own covering s_waitcnt and never sooner: either a
    _Part (parts()), or the GroupLoad itself in an entry the waves share (issue_group), the share then being
    the completing wave's slot. The group s_waitcnt stores the shares of all the waves it completes in one
    fancy-indexed store. seq orders two loads into the same registers of a wave (issue order)."""

    __slots__ = ("regs", "slots", "row", "end", "data", "seq", "_kof")

    def __init__(self, regs, slots, row, data):
        self.regs, self.slots, self.row, self.end, self.data = regs, slots, row, row + data.shape[1], data
        self.seq = next(_LOAD_SEQ)
        self._kof = None

    def parts(self) -> list:
        return [_Part(self, k) for k in range(len(self.slots))]

    def store(self, ks=None):
        """Deliver the shares of waves ks (distinct indices; None: every wave)."""
        if ks is None or len(ks) == len(self.slots):
            self.regs[self.slots, self.row: self.end] = self.data
        else:
            self.regs[self.slots[ks], self.row: self.end] = self.data[ks]

    def ks_of(self, slots) -> list:
        """The wave indices of these register slots."""
        kof = self._kof
        if kof is None:
            kof = self._kof = {s: k for k, s in enumerate(self.slots.tolist())}
        return [kof[s] for s in slots]

    def store_slots(self, slots):
        """Deliver the shares of the waves in these register slots (distinct)."""
        self.store(None if len(slots) == len(self.slots) else self.ks_of(slots))


class _Part:
    """One wave's share of a GroupLoad: called, it delivers that wave alone (WaveSan._complete)."""

    __slots__ = ("load", "k")

    def __init__(self, load, k):
        self.load, self.k = load, k

    def __call__(self):
        ld = self.load
        ld.regs[ld.slots[self.k], ld.row: ld.end] = ld.data[self.k]


class _Held:
    """What a group s_waitcnt holds back to its last wave: GroupLoad shares (load -> wave indices from
    _Parts, `shares`; load -> register slots from shared entries, `slots`) and the registers of the current
    wave's held shares (`mask`)."""

    __slots__ = ("shares", "slots", "mask")

    def __init__(self):
        self.shares, self.slots, self.mask = {}, {}, 0

    def store(self):
        """Deliver the held shares, older loads first (two loads into one register: the newer wins)."""
        sh, sl = self.shares, self.slots
        if len(sh) + len(sl) > 1:
            for ld in sorted([*sh, *sl], key=_seq):
                ks = sh.get(ld)
                if ks is not None:
                    ld.store(ks)
                else:
                    ld.store_slots(sl[ld])
        else:
            for ld, ks in sh.items():
                ld.store(ks)
            for ld, slots in sl.items():
                ld.store_slots(slots)
        sh.clear()
        sl.clear()
        self.mask = 0


def _seq(ld):
    return ld.seq


# ---- per-wave state -----------------------------------------------------------------------------------

class WaveSan:
    """Outstanding memory operations, MFMA hazards and the handles handlers call."""

    __slots__ = ("wave", "waits", "hazards_on", "lanes_on", "races", "mem", "lds", "vm", "lgkm", "pend", "overlap",
                 "hazards", "clock", "hz_dst", "static", "insts", "base", "cur_pc")

    def __init__(self, wave, det, static, program, mem, lds_shadow):
        self.wave = wave
        self.waits = "waits" in det
        self.hazards_on = "hazards" in det
        self.lanes_on = "lanes" in det
        self.races = lds_shadow if "races" in det else None
        self.mem = mem
        self.vm = deque()          # entries: [mask, apply, lds_rec, pc]
        self.lgkm = deque()        # entries: [mask, apply, lds_rec, pc, is_smem]
        self.pend = 0              # the union of the outstanding entries' masks
        self.overlap = False       # an entry issued over a pending register since the queues were last empty
        self.hazards = []          # (dst mask, clock at issue, passes, pc)
        self.clock = 0
        self.hz_dst = 0            # the union of the entries' dst masks (expired ones included)
        self.static = static
        self.insts = program.insts
        self.base = program.base
        self.cur_pc = 0

    # -- issue/complete ---------------------------------------------------------------------------------
    def issue(self, queue: str, mask: int, apply, lds_rec=None):
        """queue: 'vm', 'lds' or 'smem'. apply() delivers the result; lds_rec: lds_record's
        (write?, indices, unit), recorded for the race check when the access completes."""
        pc = self.cur_pc
        if not self.waits:
            if apply is not None:
                apply()
            if lds_rec is not None and self.races is not None:
                self._record(lds_rec, pc)
            return
        if mask & self.pend:
            self._clash(queue, mask)
            self.overlap = True
        if queue == "vm":
            self.vm.append([mask, apply, lds_rec, pc])
        else:
            self.lgkm.append([mask, apply, lds_rec, pc, queue == "smem"])
        self.pend |= mask

    def _clash(self, queue, mask):
        """Report a load into registers with an outstanding load that may complete after it."""
        q = self.vm if queue == "vm" else self.lgkm
        other = self.lgkm if queue == "vm" else self.vm
        clash = [e for e in other if e[0] & mask]
        if queue == "smem" or any(len(e) > 4 and e[4] for e in q if e[0] & mask):
            clash += [e for e in q if e[0] & mask]
        if clash:
            e = clash[0]
            raise SanitizerError(
                "missing-wait", f"overwrites {reg_names(mask & e[0], self.static.acc)} while "
                f"'{self._text(e[3])}' (pc {e[3]:#x}) into them is outstanding; the two may complete in "
                f"either order")

    def _record(self, lds_rec, pc):
        write, idx, unit = lds_rec
        self.races.record(self.wave.wave_id, write, idx, unit, self, pc, self.cur_pc)

    def _complete(self, e, held):
        apply = e[1]
        if apply is not None:
            t = type(apply)
            if held is not None and (t is _Part or t is GroupLoad):
                if t is _Part:
                    ks = held.shares.get(apply.load)
                    if ks is None:
                        held.shares[apply.load] = [apply.k]
                    else:
                        ks.append(apply.k)
                else:
                    sl = held.slots.get(apply)
                    if sl is None:
                        held.slots[apply] = [self.wave.slot]
                    else:
                        sl.append(self.wave.slot)
                held.mask |= e[0]
            else:
                # a closure touches only its entry's registers (e[0]; missing waits rely on it): shares of
                # this wave held for them go first
                if held is not None and e[0] & held.mask:
                    held.store()
                if t is GroupLoad:          # an entry the group's waves share: this wave's rows
                    apply.store_slots((self.wave.slot,))
                else:
                    apply()
        if e[2] is not None and self.races is not None:
            self._record(e[2], e[3])

    def _repend(self):
        p = 0
        for e in self.vm:
            p |= e[0]
        for e in self.lgkm:
            p |= e[0]
        self.pend = p

    def waitcnt(self, vm: int, lgkm: int, held=None):
        """Complete what s_waitcnt vmcnt(vm) lgkmcnt(lgkm) covers. `held` (the group s_waitcnt's _Held)
        collects GroupLoad shares for after every wave of the group.

        pend afterwards: when only vm entries completed and some remain, and no outstanding entry was issued
        over a pending register (`overlap`), the outstanding masks are disjoint, so clearing the completed
        ones' bits leaves the union of the rest exactly (no scan of a long queue); else the remaining
        entries are scanned (_repend)."""
        vmq, lq = self.vm, self.lgkm
        done = 0            # the completed vm masks, kept only when vm entries remain (vm > 0)
        if len(vmq) > vm:
            if held is None:
                while len(vmq) > vm:
                    e = vmq.popleft()
                    if vm:
                        done |= e[0]
                    self._complete(e, held)
            else:
                slots = held.slots
                while len(vmq) > vm:
                    e = vmq.popleft()
                    if vm:
                        done |= e[0]
                    apply = e[1]
                    if type(apply) is GroupLoad:            # a shared entry's share (_complete, inlined)
                        sl = slots.get(apply)
                        if sl is None:
                            slots[apply] = [self.wave.slot]
                        else:
                            sl.append(self.wave.slot)
                        held.mask |= e[0]
                    elif apply is not None or e[2] is not None:
                        self._complete(e, held)
        elif len(lq) <= lgkm:
            return
        scan = False
        if len(lq) > lgkm:
            if lgkm == 0 or not any(e[4] for e in lq):
                if held is None:
                    while len(lq) > lgkm:
                        self._complete(lq.popleft(), held)
                else:
                    shares, races, wid, cur = held.shares, self.races, self.wave.wave_id, self.cur_pc
                    while len(lq) > lgkm:
                        e = lq.popleft()
                        apply = e[1]
                        if type(apply) is _Part:            # _complete, inlined for a group's LDS reads
                            ks = shares.get(apply.load)
                            if ks is None:
                                shares[apply.load] = [apply.k]
                            else:
                                ks.append(apply.k)
                            held.mask |= e[0]
                        elif apply is not None:
                            self._complete(e, held)
                            continue
                        rec = e[2]
                        if rec is not None and races is not None:       # _record, inlined
                            races.record(wid, rec[0], rec[1], rec[2], self, e[3], cur)
            else:
                # SMEM may complete out of order: only LDS operations older than the newest `lgkm` LDS ones
                lds = [e for e in lq if not e[4]]
                finished = lds[: max(0, len(lds) - lgkm)]
                for e in finished:
                    self._complete(e, held)
                ids = {id(e) for e in finished}
                self.lgkm = deque(e for e in lq if id(e) not in ids)
            scan = True
        if not self.vm and not self.lgkm:
            self.pend = 0
            self.overlap = False
        elif scan or self.overlap or not vm:
            self._repend()
        else:
            self.pend &= ~done

    def drain(self):
        self.waitcnt(0, 0)

    # -- checks ------------------------------------------------------------------------------------------
    def missing_wait(self, i: int):
        hit = self.pend & self.static.touch[i]
        for e in list(self.vm) + list(self.lgkm):
            if e[0] & hit:
                cnt = "vmcnt" if len(e) == 4 else "lgkmcnt"
                raise SanitizerError(
                    "missing-wait", f"reads/writes {reg_names(e[0] & hit, self.static.acc)} before the "
                    f"s_waitcnt {cnt} covering '{self._text(e[3])}' (pc {e[3]:#x})")
        raise SanitizerError("missing-wait", f"touches {reg_names(hit, self.static.acc)} with a load outstanding")

    def mfma_issued(self, i: int):
        self._mfma_entry(self.static.dst_of_mfma[i], self._passes(i), self.base + 4 * i)

    def _passes(self, i: int) -> int:
        passes = self.static.passes_of_mfma[i]
        if passes is None:                      # computed once per instruction (a regex on the mnemonic)
            passes = self.static.passes_of_mfma[i] = mfma_passes(self.insts[self.base + 4 * i])
        return passes

    def _mfma_entry(self, dst: int, passes: int, pc: int):
        if not self.hazards:
            self.clock = 0
        self.hazards.append((dst, self.clock, passes, pc))
        self.hz_dst |= dst
        if len(self.hazards) > 32:  # a long run of instructions that never met the list: drop the expired
            self.hazards = [e for e in self.hazards if self.clock - e[1] < e[2] + 3]
            self.hz_dst = _union(self.hazards)

    @staticmethod
    def mfma_issued_all(sans, i: int):
        """s.mfma_issued(i) for each sanitizer of a lockstep group, the instruction's entry looked up once
        (one program: the same StaticInfo and base)."""
        s0 = sans[0]
        static, base = s0.static, s0.base
        dst, passes, pc = static.dst_of_mfma[i], s0._passes(i), base + 4 * i
        for s in sans:
            if s.static is static and s.base == base:
                s._mfma_entry(dst, passes, pc)
            else:
                s.mfma_issued(i)

    def check_hazards(self, i: int):
        if not self.static.hz_reads[i] & self.hz_dst:
            # touches no register of an entry (or has no hazard class): no entry can fire, only time passes
            # (expired entries are dropped at the next instruction that touches one, or past 32 entries at an
            # MFMA's issue; elapsed only grows)
            self.clock += self.static.wait_states[i]
            return
        hz = self.static.hz[i]
        live = []
        for dmask, t0, passes, pc in self.hazards:
            elapsed = self.clock - t0
            if elapsed >= passes + 3:
                continue
            live.append((dmask, t0, passes, pc))
            need = 0
            if hz == "valu" or hz == "mem":
                if self.static.touch[i] & dmask:
                    need = passes + 3
            elif hz is not None:
                _, ab, c = hz
                if ab & dmask:
                    need = passes + 3
                elif c & dmask:
                    need = (2 if passes == 2 else 0) if c == dmask else passes + 1
            if elapsed < need:
                raise SanitizerError(
                    "mfma-hazard", f"reads/writes {reg_names(dmask & (self.static.touch[i]), self.static.acc)} "
                    f"{elapsed} wait states after '{self._text(pc)}' (pc {pc:#x}, {passes} passes) wrote them; "
                    f"the CDNA3 ISA requires {need} (s_nop or independent instructions)")
        self.hazards = live
        self.hz_dst = _union(live)
        self.clock += self.static.wait_states[i]

    def _text(self, pc):
        inst = self.insts.get(pc)
        return inst.text.strip() if inst else "?"


def issue_group(waves, mask: int, shared, each=None):
    """Lockstep: one vm queue entry per wave of a group instruction, issued in the group's order as
    WaveSan.issue would (a clash reports naming its wave). With `each` None every wave gets the same entry
    (one list, never mutated), whose apply `shared` is None (a store) or a GroupLoad over exactly these waves
    (each wave completing it delivers its own rows); else each[n] is wave n's apply (a closure, None, or a
    GroupLoad holding that wave). The waves share one sanitizer setting (one batch)."""
    s0 = waves[0].san
    if s0 is None or not s0.waits:            # delivered now (a GroupLoad holds only waves of the group)
        if each is None:
            if shared is not None:
                shared.store()
            return
        stored = set()
        for apply in each:
            if type(apply) is GroupLoad:
                if apply not in stored:
                    apply.store()
                    stored.add(apply)
            elif apply is not None:
                apply()
        return
    pc = s0.cur_pc
    entry = [mask, shared, None, pc] if each is None else None
    for n, w in enumerate(waves):
        s = w.san
        if mask & s.pend:
            try:
                s._clash("vm", mask)
            except Exception as e:
                e.wave = w
                raise
            s.overlap = True
        s.vm.append(entry if each is None else [mask, each[n], None, pc])
        s.pend |= mask


# ---- instrumenting a program --------------------------------------------------------------------------

class Instrumented:
    """A program's handler table with s_waitcnt / MFMA / SMEM replaced by sanitizer-aware handlers."""

    def __init__(self, program, acc: int):
        self.static = StaticInfo(program, acc)
        self.static.dst_of_mfma = [0] * len(program.table)
        self.static.passes_of_mfma = [None] * len(program.table)
        table = list(program.table)
        for inst in program.insts.values():
            i = (inst.pc - program.base) >> 2
            fn, nxt = table[i]
            m = inst.mnemonic
            if m == "s_waitcnt":
                vm, lgkm = waitcnt_fields(inst)
                table[i] = (_waitcnt_handler(vm, lgkm), nxt)
            elif m.startswith(("v_mfma", "v_smfmac")):
                masks = [op_mask(t, acc) for t in inst.operands]
                self.static.dst_of_mfma[i] = masks[0] if masks else 0
                table[i] = (_mfma_handler(fn, i), nxt)
            elif m.startswith(("s_load", "s_buffer_load")):
                table[i] = (_smem_handler(fn, inst, self.static.dst[i]), nxt)
        for i, (writer, row) in stale_readlanes(program, acc).items():
            inst = program.insts[program.base + 4 * i]
            table[i] = (_readlane_handler(table[i][0], inst, program.insts[writer], row, acc), table[i][1])
        self.table = table


def _union(hazards) -> int:
    u = 0
    for e in hazards:
        u |= e[0]
    return u


def _waitcnt_handler(vm, lgkm):
    def h(w):
        s = w.san
        if s is not None:
            s.waitcnt(vm, lgkm)

    def group(waves):
        """Lockstep: every wave completes its own entries in the group's order, as alone, but the GroupLoad
        shares wait for one store per load after the last wave (or before a closure into their registers)."""
        held = _Held()
        for w in waves:
            s = w.san
            if s is not None and (len(s.vm) > vm or len(s.lgkm) > lgkm):
                held.mask = 0
                try:
                    s.waitcnt(vm, lgkm, held)
                except Exception as e:
                    e.wave = w
                    raise
        if held.shares or held.slots:
            held.store()
    h.group = group
    return h


def _mfma_handler(fn, i):
    def h(w):
        r = fn(w)
        s = w.san
        if s is not None and s.hazards_on:
            s.mfma_issued(i)
        return r
    together = getattr(fn, "group", None)
    if together is not None:           # lockstep's form for a group of waves (ops_matrix.build_mfma)
        def group(waves):
            together(waves)
            sans = [s for s in (w.san for w in waves) if s is not None and s.hazards_on]
            if sans:
                WaveSan.mfma_issued_all(sans, i)
        h.group = group
    return h


def _readlane_handler(fn, inst, writer, row, acc):
    """v_readlane_b32 after a write under the current EXEC (stale_readlanes): its lane must be in EXEC."""
    sel = scalar_reader(parse_operand(inst.operands[2]))
    reg = f"v{row}" if row < acc else f"a{row - acc}"

    def h(w):
        s = w.san
        if s is not None and s.lanes_on:
            lane = sel(w) & 63
            ex = w.s[EXEC_LO] | (w.s[EXEC_HI] << 32)
            if not (ex >> lane) & 1:
                raise SanitizerError(
                    "inactive-lane", f"reads lane {lane} of {reg}, but '{writer.text.strip()}' (pc {writer.pc:#x}) "
                    f"last wrote {reg} under this EXEC ({ex:#018x}), which leaves lane {lane} out: the lane holds "
                    "an older value (undefined to LLVM); read the lane where it is active, before the branch")
        return fn(w)
    return h


def _smem_handler(fn, inst, mask):
    """Run the scalar load now, check its address, and deliver the SGPRs at the covering s_waitcnt."""
    ops = [parse_operand(o) for o in inst.operands]
    m = re.match(r"s_(load|buffer_load)_dword(?:x(\d+))?$", inst.mnemonic)
    n = int(m.group(2) or 1) if m else 1
    dst = ops[0].index
    base_idx = ops[1].index if len(ops) > 1 else 0
    is_buffer = inst.mnemonic.startswith("s_buffer")
    imm = int(inst.mods.get("offset", "0"), 0) if "offset" in inst.mods else 0
    soff_idx, cimm = None, 0
    for o in ops[2:]:
        if o.kind == "const":
            cimm += int(o.value)
        elif o.kind == "s":
            soff_idx = o.index
    what = f"'{inst.text.strip()}'"

    def reach(sg):
        """(address, bytes read) of the load from these SGPRs: a buffer's num_records clips each wave's."""
        base = sg[base_idx] | ((sg[base_idx + 1] & (0xFFFF if is_buffer else 0xFFFFFFFF)) << 32)
        off = imm + cimm + (sg[soff_idx] if soff_idx is not None else 0)
        nb = 4 * n
        if is_buffer:
            nb = max(0, min(nb, sg[base_idx + 2] - (off & ~3)))
        return (base + (off & ~3)) & ((1 << 64) - 1), nb

    def load(w):
        """The load now, its SGPRs delivered by the wave's queue (at the covering s_waitcnt)."""
        old = w.s[dst: dst + n]
        fn(w)
        new = w.s[dst: dst + n]
        w.s[dst: dst + n] = old
        w.san.issue("smem", mask, lambda: w.s.__setitem__(slice(dst, dst + n), new))

    def h(w):
        s = w.san
        if s is None:
            return fn(w)
        if s.mem is not None:
            addr, nb = reach(w.s)
            if nb:
                s.mem.check(np.array([addr]), nb, np.array([0]), what, read=True, write=False)
        load(w)

    def group(waves):
        """Lockstep: the group's addresses in one memory check per byte count (a read check has no side
        effect), then each wave's load and queue entry in order. Should a check report, the waves run one
        by one instead, so the report and its wave are the per-wave path's."""
        mem = waves[0].san.mem if waves[0].san is not None else None
        if mem is not None and all(w.san is not None and w.san.mem is mem for w in waves):
            by_nb = {}
            for w in waves:
                addr, nb = reach(w.s)
                if nb:
                    by_nb.setdefault(nb, []).append(addr)
            try:
                for nb, addrs in by_nb.items():
                    mem.check(np.array(addrs), nb, np.zeros(len(addrs), np.int64), what, read=True, write=False)
            except SanitizerError:
                one_by_one(waves)
                raise AssertionError("a grouped scalar-load check reported, the per-wave checks did not")
            for w in waves:
                try:
                    load(w)
                except SanitizerError as e:
                    e.wave = w
                    raise
            return
        one_by_one(waves)

    def one_by_one(waves):
        for w in waves:
            try:
                h(w)
            except SanitizerError as e:
                e.wave = w
                raise
    h.group = group
    return h
