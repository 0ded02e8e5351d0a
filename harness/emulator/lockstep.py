"""Lockstep execution: the waves of a workgroup that stand at one PC run each instruction together.

A batch (a few workgroups, consecutive in the launch's seeded order) keeps its waves' vector registers in
one (waves, N, 64) array (each Wave.v is its (N, 64) slice). Waves at the same PC form a group; an
instruction whose handler is shape-generic (the table-driven VALU ops and the f32 fmac / fmaak / fmamk /
division-step forms: they read rows and constants, broadcast SGPRs and write rows under EXEC) runs once for
the whole group, when the SGPRs it reads hold one value in every wave, on rows of (waves, 64) (a view of the register file where the waves' slots are consecutive,
else a gather and a scatter), under each wave's EXEC (operands.exec_mask gives the (waves, 64) masks when
they differ); a handler with a
`group` attribute (buffer loads, LDS accesses, MFMAs, v_cndmask, v_div_scale, s_waitcnt under the sanitizer)
takes the whole group in one call; every other instruction runs wave by wave with the same handler as alone.
A group ends where its waves' PCs part (a branch taken by some, a barrier, s_endpgm); the scheduler then
forms the next one. Barriers are per workgroup, each workgroup keeps its own LDS.

What stays the same as running waves alone: every handler's effect on each wave, the instruction counts,
the memory/LDS counters (each access is still one wave's), and the sanitizer's per-wave checks (missing
waits and MFMA hazards are checked for every wave before the instruction, LDS accesses are recorded per
wave, so a race between two waves in one barrier epoch is seen whatever the order). What differs is only
the interleaving, which is a legal one: with the sanitizer's interleaving on, the seeded generator picks
the group's leader, how many instructions it runs before the next pick and the order in which its waves
take each wave-by-wave instruction; the seeded workgroup order decides which workgroups share a batch.
Without it the laggards by PC go first, and a wave that executes s_sleep (a flag poll) yields until every
awake wave has run, as a GPU keeps running the other waves while one polls.
"""

from __future__ import annotations

import numpy as np

from .dispatch import classify
from .operands import parse_operand
from .semantics import OPS, PK16, PK32
from .ops_scalar import BARRIER

SLICE_MAX = 48      # longest run of one group before the seeded scheduler may switch

# Table rows whose fn is written for one wave's (64,) lanes (none today: each row takes any shape).
_NOT_BATCHED = frozenset()
# Special VALU builders (ops_vector.SPECIAL) whose handlers only read rows, SGPRs and constants and write
# rows under EXEC, like the table rows (tests/test_lockstep_ops.py runs each both ways;
# the gfx9 mac/madak/madmk forms do not exist on gfx950).
_BATCHED_SPECIAL = frozenset(("v_fmac_f32", "v_fmamk_f32", "v_fmaak_f32", "v_div_fmas_f32", "v_div_fixup_f32",
                              "v_bitop3_b32", "v_bitop3_b16"))


def _float_sources(k) -> int:
    """How many floating-point sources the instruction's table row reads (special builders: all float)."""
    table = {"v_op": OPS, "v_pk16": PK16, "v_pk32": PK32}.get(k.family)
    if table is None or k.base not in table:
        return 3
    return sum(t.startswith(("f", "bf")) for t in table[k.base].sources)


def batched_table(program) -> list:
    """Per instruction: None when its handler runs wave by wave, else the SGPRs it reads (a tuple, often
    empty): it runs on a (waves, 64) view when they hold one value in every wave. (With per-wave SGPR values
    numpy may pick another NaN of two NaN operands than the 0-d value of a wave alone gives, so only rows
    with two or more float sources list their SGPRs; integer rows run batched whatever the SGPRs hold.)"""
    cache = program.__dict__.get("_lockstep_table")
    if cache is not None:
        return cache
    out = [None] * len(program.table)
    for inst in program.insts.values():
        i = (inst.pc - program.base) >> 2
        if inst.pc in program.unknown:
            continue
        k = classify(inst.mnemonic)
        table_row = k.family in ("v_op", "v_pk16", "v_pk32")
        if not (table_row or (k.family == "v_special" and k.base in _BATCHED_SPECIAL)):
            continue
        if k.enc not in ("", "e32", "e64", "dpp"):       # DPP: ops_vector.Dpp permutes the lanes' last axis
            continue
        if k.base in _NOT_BATCHED:
            continue
        try:
            ops = [parse_operand(o) for o in inst.operands]
        except Exception:  # noqa: BLE001 - an operand the builders did not accept either
            continue
        if {o.kind for o in ops} <= {"v", "a", "s", "const"}:
            out[i] = (tuple(o.index + n for o in ops if o.kind == "s" for n in range(o.count))
                      if _float_sources(k) >= 2 else ())
    program.__dict__["_lockstep_table"] = out
    return out


def sleep_table(program) -> list:
    """Per instruction: True for s_sleep (where a polling wave yields)."""
    cache = program.__dict__.get("_sleep_table")
    if cache is None:
        cache = [False] * len(program.table)
        for inst in program.insts.values():
            if inst.mnemonic == "s_sleep":
                cache[(inst.pc - program.base) >> 2] = True
        program.__dict__["_sleep_table"] = cache
    return cache


class _Rows:
    """v of a batch whose register slots are consecutive: row r of every wave, as a (waves, 64) view."""

    __slots__ = ("regs", "a", "b", "shape")

    def __init__(self, regs, a, b):
        self.regs, self.a, self.b = regs, a, b
        self.shape = (regs.shape[1], b - a, regs.shape[2])

    def __getitem__(self, r):
        return self.regs[self.a:self.b, r]

    def __setitem__(self, r, value):
        self.regs[self.a:self.b, r] = value

    def where(self, r, bits, mask):
        """Row r := bits where mask (operands.store_row under EXEC)."""
        np.copyto(self.regs[self.a:self.b, r], bits, where=mask)


class _IndexedRows:
    """v of a batch whose register slots are not consecutive: row r of every wave as a (waves, 64) copy
    (a gather), written back by a scatter."""

    __slots__ = ("regs", "idx", "shape")

    def __init__(self, regs, slots):
        self.regs, self.idx = regs, np.array(slots, np.intp)
        self.shape = (regs.shape[1], len(slots), regs.shape[2])

    def __getitem__(self, r):
        return self.regs[self.idx, r]

    def __setitem__(self, r, value):
        self.regs[self.idx, r] = value

    def where(self, r, bits, mask):
        row = self.regs[self.idx, r]
        np.copyto(row, bits, where=mask)
        self.regs[self.idx, r] = row


class _Sgprs:
    """s of a batch (read only): a Python int when every wave holds the same value, else a (waves, 1) array."""

    __slots__ = ("waves",)

    def __init__(self, waves):
        self.waves = waves

    def __getitem__(self, i):
        ws = self.waves
        v0 = ws[0].s[i]
        for w in ws:
            if w.s[i] != v0:
                return np.array([x.s[i] for x in ws], np.uint64)[:, None]
        return v0

    def __setitem__(self, i, value):
        raise RuntimeError("a batched instruction wrote an SGPR")


class _Batch:
    __slots__ = ("v", "s", "waves")

    def __init__(self, regs, waves):
        a, n = waves[0].slot, len(waves)
        self.v = _Rows(regs, a, a + n) if waves[-1].slot - a == n - 1 else _IndexedRows(regs, [w.slot for w in waves])
        self.s = _Sgprs(waves)
        self.waves = waves


def batch_of(waves):
    """For a handler's group form: (the waves in slot order, a _Batch over them, or None for one wave)."""
    if len(waves) == 1:
        return waves, None
    waves = sorted(waves, key=_slot)
    return waves, _Batch(waves[0].v.base, waves)


def _uniform(waves, sgprs) -> bool:
    """Do these SGPRs hold one value in every wave?"""
    for i in sgprs:
        v0 = waves[0].s[i]
        for w in waves:
            if w.s[i] != v0:
                return False
    return True


def _slot(w):
    return w.slot


def _pc(w):
    return w.pc


def run_batch(workgroups, regs, program, table, static, hits, counters, rng, interleave, ended, stopped):
    """Run the waves of a few workgroups to s_endpgm, each workgroup with its own barriers and LDS.

    workgroups: [(wg, waves)], the waves' registers being regs[w.slot]; `table`: the (instrumented) handler
    table; `static`: the sanitizer's StaticInfo or None; `ended(w)` runs when a wave ends; `stopped(w)`
    names the wave an exception came from (its w.pc is set to the instruction)."""
    base = program.base
    batched = batched_table(program)
    sleeps = sleep_table(program)
    touch = static.touch if static is not None else None
    hz_reads = static.hz_reads if static is not None else None
    wait_states = static.wait_states if static is not None else None
    running = sorted((w for _, waves in workgroups for w in waves), key=_slot)
    at_barrier = {id(wg): [] for wg, _ in workgroups}
    active = {id(wg): len(waves) for wg, waves in workgroups}      # waves of the workgroup not at a barrier
    asleep: set = set()     # slots of waves whose last instruction was s_sleep (they yield to the others)
    while running:
        if interleave:
            lead = running[rng.randrange(len(running))] if len(running) > 1 else running[0]
            budget = rng.randint(1, SLICE_MAX)
        else:
            # The laggards first, so waves meet again; a wave that sleeps (polls a flag) waits until every
            # awake wave has run, or a spinning group would starve the waves that publish what a peer
            # rank waits for (a cross-rank deadlock that no GPU has: there every wave is scheduled).
            awake = [w for w in running if w.slot not in asleep]
            if not awake:
                asleep.clear()
                awake = running
            lead = min(awake, key=_pc)
            budget = -1
        pc = lead.pc
        group = [w for w in running if w.pc == pc]
        for w in group:
            asleep.discard(w.slot)
        batch = _Batch(regs, group) if len(group) > 1 else None     # group: in slot order
        if interleave and len(group) > 1:
            # the order in which the group's waves take each wave-by-wave instruction (memory) is seeded too
            group = group.copy()
            rng.shuffle(group)
        cur = group[0]
        done = []
        try:
            while budget:
                budget -= 1
                i = (pc - base) >> 2
                fn, nxt = table[i]
                hits[i] += len(group)
                if touch is not None:
                    t, reads = touch[i], hz_reads[i]
                    for w in group:
                        cur = w
                        ws = w.san
                        ws.cur_pc = pc
                        if ws.pend & t:
                            ws.missing_wait(i)
                        if ws.hazards:
                            if reads & ws.hz_dst:
                                ws.check_hazards(i)
                            else:           # check_hazards' first branch: no entry can fire, time passes
                                ws.clock += wait_states[i]
                sgprs = batched[i]
                if sgprs is not None:
                    if batch is not None and _uniform(batch.waves, sgprs):
                        cur = batch.waves[0]
                        fn(batch)     # under each wave's EXEC (operands.exec_mask of a batch)
                    else:
                        for w in group:
                            cur = w
                            fn(w)
                    pc = nxt
                    continue
                parted = False
                pc0 = None
                together = getattr(fn, "group", None)
                if together is not None and len(group) > 1:
                    # a handler with a group form (buffer loads): one call for the whole group, in its order
                    cur = group[0]
                    together(group)
                    pc = nxt
                    continue
                for w in group:
                    cur = w
                    r = fn(w)
                    if r is None:
                        w.pc = nxt
                    elif r >= 0:
                        w.pc = r
                    else:
                        w.pc = nxt
                        done.append((w, r))
                    if pc0 is None:
                        pc0 = w.pc
                    elif w.pc != pc0:
                        parted = True
                if sleeps[i] and not interleave:  # the seeded interleaving switches waves by itself
                    asleep.update(w.slot for w in group)
                    break
                if done or parted:
                    break
                pc = pc0
            else:
                for w in group:
                    w.pc = pc
        except Exception as e:
            for w in group:
                w.pc = pc
            stopped(getattr(e, "wave", cur))
            raise
        for w, r in done:
            running.remove(w)
            key = id(w.wg)
            active[key] -= 1
            if r == BARRIER:
                at_barrier[key].append(w)
            else:
                try:
                    ended(w)
                except Exception:
                    stopped(w)
                    raise
            if active[key] == 0 and at_barrier[key]:
                # every live wave of the workgroup waits: the barrier releases
                counters.barriers += 1
                if w.wg.shadow is not None:
                    race = w.wg.shadow.end_epoch()
                    if race is not None:
                        raise race      # the engine reports the earliest race of the batch
                released = at_barrier[key]
                at_barrier[key] = []
                active[key] = len(released)
                running = sorted(running + released, key=_slot)
