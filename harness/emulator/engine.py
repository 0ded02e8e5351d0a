"""Execute one kernel launch: workgroups in a (seeded) order, each workgroup's waves round-robin between
barriers, every wave starting from the register state the hardware sets up."""

from __future__ import annotations

import ctypes
import os
import random
import struct
import time
from dataclasses import dataclass, field

import numpy as np

from .codeobject import Kernel
from .counters import Counters
from .ops_scalar import BARRIER, ENDPGM
from .state import EXEC_HI, EXEC_LO, N_VGPR_FILE, WAVE, Wave
from .translate import Program, gc_paused
from . import lockstep as lockstep_mod
from . import sanitizer as san_mod

# Waves of a workgroup run in lockstep (lockstep.py) unless AMD_KERNELS_EMULATOR_LOCKSTEP=0 or the launch
# option lockstep=False: the per-wave loops below are the reference the lockstep path is tested against.
LOCKSTEP = os.environ.get("AMD_KERNELS_EMULATOR_LOCKSTEP", "1") != "0"
LOCKSTEP_WAVES = 64     # waves per lockstep batch: whole workgroups, consecutive in the launch order

YIELD = -1000       # run_wave_sanitized: the wave's slice of the interleaving ran out


class LaunchError(RuntimeError):
    pass


class SanitizerReport(LaunchError):
    """A sanitizer detector fired: .kind is 'missing-wait', 'mfma-hazard', 'lds-race', 'out-of-bounds',
    'uninitialized'; the message names kernel, workgroup, wave, PC and instruction."""

    def __init__(self, message, kind):
        super().__init__(message)
        self.kind = kind


# Callables run with each wave when it reaches s_endpgm (tests inspect final register state this way).
wave_end_hooks: list = []


@dataclass
class LaunchRecord:
    kernel_name: str
    grid: tuple
    block: tuple
    counters: dict
    workgroups_executed: list | None = None   # None: all of them ran; else the (x, y, z) ids that ran
    seconds: float = 0.0
    stored: np.ndarray | None = None          # (k, 2) int64 sorted disjoint [start, end) global bytes stored
    sanitized: frozenset = frozenset()        # detectors that were on

    @property
    def wave_instructions(self) -> int:
        return self.counters.get("wave_instructions", 0)

    @property
    def sampled(self) -> bool:
        return self.workgroups_executed is not None


class _Workgroup:
    def __init__(self, ids, lds_bytes, lds=None, lds_row=None):
        self.ids = ids
        # lds: row `lds_row` of a lockstep batch's (workgroups, bytes) array (the LDS group forms in
        # ops_memory index every workgroup of the batch at once), or its own array
        self.lds = np.zeros(max(lds_bytes, 4), np.uint8) if lds is None else lds
        self.lds_row = lds_row
        self.lds32 = None
        self.shadow = None


class _LaunchState:
    def __init__(self, counters):
        self.counters = counters
        self.mode_reg = 0
        self.clock = 0
        self.mem = None          # sanitizer.MemoryMap when memory checking is on


def _dispatch_packet(kernel: Kernel, grid, block, kernarg_addr, lds_bytes):
    """An hsa_kernel_dispatch_packet_t for kernels that read their dispatch pointer."""
    dims = 3 if grid[2] > 1 or block[2] > 1 else (2 if grid[1] > 1 or block[1] > 1 else 1)
    pkt = struct.pack(
        "<HHHHHHIIIIIQQQQ", 0, dims, block[0], block[1], block[2], 0,
        grid[0] * block[0], grid[1] * block[1], grid[2] * block[2],
        kernel.private_segment_fixed_size, lds_bytes, 0, kernarg_addr, 0, 0)
    return np.frombuffer(pkt, np.uint8).copy()


def _init_wave(w: Wave, kernel: Kernel, wave_in_group: int, block, ids, grid, kernarg_addr, dispatch_addr):
    d = kernel.descriptor
    s = w.s
    for name, first in d.user_sgprs:
        if name == "kernarg_segment_ptr":
            s[first], s[first + 1] = kernarg_addr & 0xFFFFFFFF, kernarg_addr >> 32
        elif name == "dispatch_ptr":
            s[first], s[first + 1] = dispatch_addr & 0xFFFFFFFF, dispatch_addr >> 32
        elif name == "dispatch_id":
            s[first], s[first + 1] = 0, 0
        # private segment buffer / queue ptr / flat scratch: zero (no scratch support)
    n = d.user_sgpr_count
    for enabled, value in zip(d.workgroup_id_enabled, ids):
        if enabled:
            s[n] = value
            n += 1
    if d.workgroup_info_enabled:
        s[n] = 0
        n += 1
    if d.enable_private_segment:
        s[n] = 0
    bx, by, bz = block
    t = wave_in_group * WAVE + np.arange(WAVE)
    x, y, z = t % bx, (t // bx) % by, t // (bx * by)
    v0 = x.astype(np.uint32)
    if d.vgpr_workitem_ids >= 1:
        v0 |= (y.astype(np.uint32) << 10)
    if d.vgpr_workitem_ids >= 2:
        v0 |= (z.astype(np.uint32) << 20)
    w.v[0] = v0
    valid = t < bx * by * bz
    exec_bits = int(np.packbits(valid, bitorder="little").view(np.uint64)[0])
    s[EXEC_LO], s[EXEC_HI] = exec_bits & 0xFFFFFFFF, exec_bits >> 32


def run_wave(w: Wave, program: Program, hits: list) -> int:
    """Run until the wave reaches s_barrier (BARRIER) or s_endpgm (ENDPGM)."""
    table, base = program.table, program.base
    pc = w.pc
    while True:
        i = (pc - base) >> 2
        fn, nxt = table[i]
        hits[i] += 1
        try:
            r = fn(w)
        except Exception:
            w.pc = pc
            raise
        if r is None:
            pc = nxt
        elif r >= 0:
            pc = r
        else:
            w.pc = nxt
            return r


def run_wave_sanitized(w: Wave, program: Program, table, static, hits: list, budget: int) -> int:
    """run_wave with the sanitizer's per-instruction checks, for at most `budget` instructions (YIELD)."""
    base = program.base
    touch = static.touch
    ws = w.san
    pc = w.pc
    try:
        while budget:
            budget -= 1
            i = (pc - base) >> 2
            fn, nxt = table[i]
            hits[i] += 1
            ws.cur_pc = pc
            if ws.pend & touch[i]:
                ws.missing_wait(i)
            if ws.hazards:
                ws.check_hazards(i)
            r = fn(w)
            if r is None:
                pc = nxt
            elif r >= 0:
                pc = r
            else:
                w.pc = nxt
                return r
    except Exception:
        w.pc = pc
        raise
    w.pc = pc
    return YIELD


def _instrumented(program: Program, acc: int):
    cache = program.__dict__.setdefault("_sanitizer_tables", {})
    if acc not in cache:
        with gc_paused():                   # per-instruction tables, made once, as translation's
            cache[acc] = san_mod.Instrumented(program, acc)
    return cache[acc]


def workgroup_order(grid, seed):
    ids = [(x, y, z) for z in range(grid[2]) for y in range(grid[1]) for x in range(grid[0])]
    if seed is not None:
        random.Random(seed).shuffle(ids)
    return ids


def _pointer_args(kernel: Kernel, kernarg: np.ndarray) -> list[int]:
    """The global-buffer (pointer) arguments of a launch, in order."""
    return [int.from_bytes(kernarg[a.offset: a.offset + 8].tobytes(), "little")
            for a in kernel.args if a.value_kind == "global_buffer"]


def _read(address: int, nbytes: int) -> bytes:
    return ctypes.string_at(address, nbytes) if nbytes > 0 else b""


def execute(program: Program, kernel: Kernel, grid, block, kernarg: np.ndarray, dynamic_lds: int,
            counters_sink, options: dict) -> LaunchRecord:
    t0 = time.perf_counter()
    counters = Counters()
    counters_sink.bind(counters)
    launch = _LaunchState(counters)
    lds_bytes = kernel.group_segment_fixed_size + dynamic_lds
    kernarg_addr = kernarg.ctypes.data
    packet = _dispatch_packet(kernel, grid, block, kernarg_addr, lds_bytes)
    ids = workgroup_order(grid, options.get("workgroup_order_seed"))
    sampled = None
    n_sample = options.get("workgroup_sample")
    wg_filter = options.get("workgroup_filter")
    chosen = wg_filter(kernel.name, tuple(grid), _pointer_args(kernel, kernarg), _read) if wg_filter else None
    if chosen is not None:
        chosen = {tuple(int(v) for v in i) for i in chosen}
        ids = [i for i in ids if i in chosen]
        sampled = sorted(set(ids), key=lambda i: (i[2], i[1], i[0]))
    elif n_sample is not None and n_sample < len(ids):
        # The sample depends on sample_seed only (not on the order), so runs in other orders check the
        # same tiles; the chosen workgroups then run in the seeded order.
        natural = sorted(ids, key=lambda i: (i[2], i[1], i[0]))
        chosen = {natural[i] for i in random.Random(options.get("sample_seed", 0)).sample(range(len(ids)), n_sample)}
        chosen |= set(options.get("workgroup_also", ())) & set(ids)
        ids = [i for i in ids if i in chosen]
        sampled = sorted(chosen, key=lambda i: (i[2], i[1], i[0]))
    threads = block[0] * block[1] * block[2]
    n_waves = (threads + WAVE - 1) // WAVE
    hits = [0] * len(program.table)
    entry = kernel.entry
    det = san_mod.detectors(options.get("sanitize"))
    mem = options.get("memory")
    memmap = mem.memory_map(extra=[(kernarg_addr, kernarg_addr + kernarg.size, "kernarg segment", None),
                                   (packet.ctypes.data, packet.ctypes.data + packet.size, "dispatch packet", None)]) \
        if mem is not None else None
    launch.mem = memmap
    sanitized = bool(det) or memmap is not None
    if sanitized:
        inst = _instrumented(program, kernel.descriptor.accum_offset)
        table, static = inst.table, inst.static
        rng = random.Random(options.get("interleave_seed") if options.get("interleave_seed") is not None
                            else options.get("workgroup_order_seed") or 0)
        interleave = "interleave" in det
    lockstep = options.get("lockstep", LOCKSTEP)
    with np.errstate(all="ignore"):
        if lockstep:
            # consecutive workgroups of the (seeded) order share a batch
            per = max(1, LOCKSTEP_WAVES // n_waves)
            for c in range(0, len(ids), per):
                chunk = ids[c: c + per]
                regs = np.zeros((len(chunk) * n_waves, N_VGPR_FILE, WAVE), np.uint32)
                lds_all = np.zeros((len(chunk), max(lds_bytes, 4)), np.uint8)
                groups = []
                for j, wg_ids in enumerate(chunk):
                    wg = _Workgroup(wg_ids, lds_bytes, lds_all[j], j)
                    if "races" in det and n_waves > 1:     # one wave cannot race
                        wg.shadow = san_mod.LdsShadow(wg.lds.size)
                    waves = []
                    for k in range(n_waves):
                        slot = j * n_waves + k
                        w = Wave(k, wg, launch, regs[slot])
                        w.slot = slot
                        _init_wave(w, kernel, k, block, wg_ids, grid, kernarg_addr, packet.ctypes.data)
                        w.pc = entry
                        if sanitized:
                            w.san = san_mod.WaveSan(w, det, static, program, memmap, wg.shadow)
                        waves.append(w)
                    groups.append((wg, waves))
                _run_lockstep(groups, regs, program, table if sanitized else program.table,
                              static if sanitized else None, hits, kernel, counters,
                              rng if sanitized else None, sanitized and interleave)
                counters.workgroups += len(chunk)
                counters.waves += len(chunk) * n_waves
        for wg_ids in ([] if lockstep else ids):
            wg = _Workgroup(wg_ids, lds_bytes)
            if "races" in det and n_waves > 1:
                wg.shadow = san_mod.LdsShadow(wg.lds.size)
            waves = []
            for k in range(n_waves):
                w = Wave(k, wg, launch)
                _init_wave(w, kernel, k, block, wg_ids, grid, kernarg_addr, packet.ctypes.data)
                w.pc = entry
                if sanitized:
                    w.san = san_mod.WaveSan(w, det, static, program, memmap, wg.shadow)
                waves.append(w)
            if sanitized:
                _run_workgroup_sanitized(waves, program, table, static, hits, kernel, wg, counters, rng,
                                         interleave)
            else:
                _run_workgroup(waves, program, hits, kernel, wg_ids, counters)
            counters.workgroups += 1
            counters.waves += n_waves
    for i, n in enumerate(hits):
        if n:
            counters.instructions[program.classes[i]] += n
    rec = LaunchRecord(kernel.name, tuple(grid), tuple(block), counters.as_dict(), sampled,
                       time.perf_counter() - t0, counters.stored_intervals(), det)
    return rec


def _fail(e, kernel, wg_ids, w, program):
    pc = getattr(e, "at_pc", None)      # an LDS race found after the fact names where its access completed
    if pc is None:
        pc = w.pc
    inst = program.insts.get(pc)
    where = (f"{kernel.name}: workgroup {wg_ids} wave {w.wave_id} pc {pc:#x} "
             f"({inst.text.strip() if inst else '?'})")
    if isinstance(e, san_mod.SanitizerError):
        return SanitizerReport(f"{where}: {e}", e.kind)
    return LaunchError(f"{where}: {type(e).__name__}: {e}")


def _report_race(shadows, kernel, program, found=None):
    """End the epochs of these workgroups' LDS shadows and raise the report of their earliest race, or of
    `found`'s if it is an earlier race (an LDS race completed before another error is the first report)."""
    race = san_mod.earliest_race(shadows, found)
    if race is not None:
        w = race.race_wave
        raise _fail(race, kernel, w.wg.ids, w, program) from race


def _run_workgroup(waves, program, hits, kernel, wg_ids, counters):
    """Waves one after another up to each barrier (the fast path, no sanitizer)."""
    live = list(waves)
    while live:
        still = []
        for w in live:
            try:
                r = run_wave(w, program, hits)
            except Exception as e:
                raise _fail(e, kernel, wg_ids, w, program) from e
            if r == BARRIER:
                still.append(w)
            else:
                for hook in wave_end_hooks:
                    hook(w)
        if still:
            counters.barriers += 1
        live = still


SLICE_MAX = 48      # longest run of one wave before the seeded scheduler may switch


def _run_lockstep(groups, regs, program, table, static, hits, kernel, counters, rng, interleave):
    failing = []

    def ended(w):
        if w.san is not None:
            w.san.drain()
        for hook in wave_end_hooks:
            hook(w)
    shadows = [wg.shadow for wg, _ in groups if wg.shadow is not None]
    try:
        lockstep_mod.run_batch(groups, regs, program, table, static, hits, counters, rng, interleave, ended,
                               failing.append)
        race = san_mod.earliest_race(shadows)       # the workgroups' last epochs
        if race is not None:
            raise race                              # reported below, as a race run_batch raised
    except Exception as e:
        _report_race(shadows, kernel, program, e)   # an LDS race completed before whatever stopped the batch
        w = failing[-1] if failing else groups[0][1][0]
        raise _fail(e, kernel, w.wg.ids, w, program) from e


def _run_workgroup_sanitized(waves, program, table, static, hits, kernel, wg, counters, rng, interleave):
    """Waves interleaved in seeded slices between barriers; a barrier releases when every live wave waits."""
    running = list(waves)
    at_barrier = []
    shadows = [wg.shadow] if wg.shadow is not None else []
    while running or at_barrier:
        if not running:
            counters.barriers += 1
            _report_race(shadows, kernel, program)
            running, at_barrier = at_barrier, []
            continue
        if interleave:
            w = running[rng.randrange(len(running))] if len(running) > 1 else running[0]
            budget = rng.randint(1, SLICE_MAX)
        else:
            w = running[0]
            budget = -1
        try:
            r = run_wave_sanitized(w, program, table, static, hits, budget)
            if r == YIELD:
                continue
            running.remove(w)
            if r == BARRIER:
                at_barrier.append(w)
            else:
                w.san.drain()
                for hook in wave_end_hooks:
                    hook(w)
        except Exception as e:
            _report_race(shadows, kernel, program, e)
            raise _fail(e, kernel, wg.ids, w, program) from e
    _report_race(shadows, kernel, program)

