"""Per-launch counters: instructions by class, MFMAs, global/LDS traffic, bank conflicts, barriers."""

from __future__ import annotations

from collections import Counter

import numpy as np

LDS_BANKS = 32          # 4-byte banks; UNSURE for gfx950 (CDNA3 has 32; a model, not a measurement)
_COMPACT_AT = 1 << 16   # pending runs before merging


class _Intervals:
    """Intervals [start, end) (bytes, or dwords with shift=2) touched, merged into a sorted disjoint (k, 2)
    int64 array.

    add() only records the lane addresses; they are turned into intervals and merged in batches (the
    merged form is the canonical union, touching intervals joined, so batching does not change it)."""

    def __init__(self, shift: int = 0):
        self._shift = shift
        self._pending: list[tuple[np.ndarray, int]] = []
        self._n = 0
        self._merged = np.zeros((0, 2), np.int64)

    def add(self, addrs: np.ndarray, nbytes: int) -> None:
        a = np.asarray(addrs).astype(np.int64)          # a copy: callers may reuse their arrays
        self._pending.append((a, nbytes))
        self._n += len(a)
        if self._n > _COMPACT_AT:
            self._compact()

    def _compact(self):
        if not self._pending:
            return
        a = np.concatenate([p[0] for p in self._pending])
        nb = np.repeat(np.array([p[1] for p in self._pending], np.int64), [len(p[0]) for p in self._pending])
        shift = self._shift
        self._pending, self._n = [], 0
        s, e = a >> shift, ((a + nb - 1) >> shift) + 1
        # Recorded intervals that each start where the one recorded before ends (a wave's contiguous lanes)
        # are one interval, their union: fewer to sort, the same union.
        if len(s) > 1:
            cont = s[1:] == e[:-1]
            if cont.any():
                s, e = s[np.concatenate([[True], ~cont])], e[np.concatenate([~cont, [True]])]
        # The union from the starts and the ends each sorted on its own (two plain sorts, no argsort): with
        # both sorted, the first i+1 intervals by start all end by the (i+1)-th smallest end, so a merged
        # interval closes there exactly when the next start lies beyond it (touching intervals join).
        # The merged starts and ends are each sorted already: sort the new ones, then a stable sort of the
        # two runs (timsort: a linear merge) instead of sorting all of them again.
        s.sort()
        e.sort()
        if len(self._merged):
            s = np.concatenate([self._merged[:, 0], s])
            e = np.concatenate([self._merged[:, 1], e])
            s.sort(kind="stable")
            e.sort(kind="stable")
        if not len(s):
            return
        gap = s[1:] > e[:-1]
        first = np.empty(len(s), bool)
        first[0], first[1:] = True, gap
        last = np.empty(len(e), bool)
        last[-1], last[:-1] = True, gap
        self._merged = np.stack([s[first], e[last]], axis=1)

    def array(self) -> np.ndarray:
        self._compact()
        return self._merged

    def units(self) -> int:
        iv = self.array()
        return int((iv[:, 1] - iv[:, 0]).sum())


class _DistinctDwords(_Intervals):
    """Distinct 4-byte-aligned dwords touched (bytes reported as 4 x dwords)."""

    def __init__(self):
        super().__init__(shift=2)

    def bytes(self) -> int:
        return 4 * self.units()


_bank_cache: dict = {}


def _bank_conflicts(addrs: np.ndarray, nbytes: int) -> int:
    """Extra LDS cycles of one wave access (lane addresses, in lane order) from bank conflicts (model)."""
    n = len(addrs)
    # Lanes served per pass: 32 for <=4 bytes, 16 for 8, 8 for 12/16 (each pass moves 128 bytes).
    per_pass = max(1, 128 // max(4, nbytes))
    ndw = max(1, (nbytes + 3) // 4)
    dw = (np.asarray(addrs, np.int64) >> 2)[:, None] + np.arange(ndw)
    passes = (np.arange(n) // per_pass)[:, None].repeat(ndw, axis=1)
    keys = np.unique(passes.ravel() * (1 << 40) + dw.ravel())     # same dword in a pass: broadcast
    p, d = keys >> 40, keys & ((1 << 40) - 1)
    counts = np.bincount(p * LDS_BANKS + d % LDS_BANKS)
    per_bank = np.zeros(((n + per_pass - 1) // per_pass) * LDS_BANKS, np.int64)
    per_bank[: counts.size] = counts
    worst = per_bank.reshape(-1, LDS_BANKS).max(axis=1)
    return int(np.maximum(worst - 1, 0).sum())


def _row_conflicts(addrs: np.ndarray, rel: np.ndarray, nbytes: int) -> int:
    """_bank_conflicts of one access, cached by its pattern `rel` (addresses less their first's dword base)."""
    key = (nbytes, rel.tobytes())
    extra = _bank_cache.get(key)
    if extra is None:
        extra = _bank_conflicts(addrs, nbytes)
        if len(_bank_cache) >= 1 << 14:
            _bank_cache.clear()
        _bank_cache[key] = extra
    return extra


class Counters:
    def __init__(self):
        self.instructions = Counter()        # class -> wave-instructions
        self.mfma = Counter()                # mnemonic -> count
        self.global_load_bytes = 0
        self.global_store_bytes = 0
        self.global_atomic_bytes = 0
        self.smem_bytes = 0
        self.lds_read_bytes = 0
        self.lds_write_bytes = 0
        self.lds_bank_conflicts = 0          # extra LDS cycles from bank conflicts (model)
        self.barriers = 0
        self.workgroups = 0
        self.waves = 0
        self._loaded = _DistinctDwords()
        self._stored = _DistinctDwords()
        self._stored_bytes = _Intervals()

    # called from instruction handlers
    def global_load(self, addrs, nbytes):
        if len(addrs):
            self.global_load_bytes += len(addrs) * nbytes
            self._loaded.add(addrs, nbytes)

    def global_store(self, addrs, nbytes):
        if len(addrs):
            self.global_store_bytes += len(addrs) * nbytes
            self._stored.add(addrs, nbytes)
            self._stored_bytes.add(addrs, nbytes)

    def global_atomic(self, addrs, nbytes):
        if len(addrs):
            self.global_atomic_bytes += len(addrs) * nbytes
            self._stored.add(addrs, nbytes)
            self._stored_bytes.add(addrs, nbytes)

    def stored_intervals(self) -> np.ndarray:
        """Sorted disjoint [start, end) byte intervals of global memory stored (incl. atomics)."""
        return self._stored_bytes.array()

    def lds_access(self, addrs, nbytes, write):
        """One wave's LDS access: its bytes and its extra cycles from bank conflicts."""
        if len(addrs):
            self.lds_access_rows(np.asarray(addrs, np.int64)[None, :], nbytes, write)

    def lds_access_rows(self, rows, nbytes, write):
        """lds_access of each access of a lockstep group: rows (..., lanes) int64, one access per row.
        A row's conflict count depends only on its addresses relative to a dword-aligned base (a common
        shift keeps equal dwords equal and rotates the banks), and a few lane patterns recur: cached by
        pattern. A group's waves mostly share one pattern (each wave's addresses shifted): then one lookup."""
        rows = rows.reshape(-1, rows.shape[-1])
        if write:
            self.lds_write_bytes += rows.size * nbytes
        else:
            self.lds_read_bytes += rows.size * nbytes
        rel = rows - (rows[:, :1] & ~3)
        if len(rows) > 1 and (rel == rel[0]).all():
            self.lds_bank_conflicts += len(rows) * _row_conflicts(rows[0], rel[0], nbytes)
            return
        for k in range(len(rows)):
            self.lds_bank_conflicts += _row_conflicts(rows[k], rel[k], nbytes)

    def as_dict(self) -> dict:
        return {
            "wave_instructions": int(sum(self.instructions.values())),
            "instructions": dict(self.instructions),
            "mfma": dict(self.mfma),
            "global_load_bytes": self.global_load_bytes,
            "global_store_bytes": self.global_store_bytes,
            "global_atomic_bytes": self.global_atomic_bytes,
            "global_load_distinct_bytes": self._loaded.bytes(),
            "global_store_distinct_bytes": self._stored.bytes(),
            "smem_bytes": self.smem_bytes,
            "lds_read_bytes": self.lds_read_bytes,
            "lds_write_bytes": self.lds_write_bytes,
            "lds_bank_conflicts": self.lds_bank_conflicts,
            "barriers": self.barriers,
            "workgroups": self.workgroups,
            "waves": self.waves,
        }
