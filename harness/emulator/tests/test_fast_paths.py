"""The emulator's fast paths give exactly what the straightforward code they replace gives.

- MemoryMap.check's one-range shortcut and clean_read against the per-lane search (reports included);
- LDS bank conflicts cached by lane pattern against a fresh computation, and a group's counted per access;
- distinct-address intervals merged in batches against merging every access at once;
- LdsShadow's race check once per barrier epoch against the plain check of every access as it completes
  (the reports included), and the records lds_record makes against the bytes of the access.
(The MFMA fast path is checked bit for bit in test_mfma.py::test_fast_path_bitwise.)
"""


import numpy as np
import pytest

from harness.emulator import counters as C
from harness.emulator import sanitizer as san
from harness.emulator.sanitizer import LdsShadow, MemoryMap, SanitizerError, lds_record


def _reference_check(mm, a, nbytes, lanes, read, write):
    """MemoryMap.check as it was before the shortcut: search every lane's range."""
    a = np.asarray(a, np.int64)
    lanes = np.asarray(lanes)
    idx = np.searchsorted(mm.starts, a, side="right") - 1
    ok = (idx >= 0) & ((a + nbytes) <= mm.ends[np.maximum(idx, 0)])
    if not ok.all():
        return ("out-of-bounds", int(a[int(np.argmin(ok))]))
    idx = np.maximum(idx, 0)
    for r in np.unique(idx).tolist():
        sh = mm.shadows[r]
        if sh is None:
            continue
        sel = idx == r
        off = (a[sel] - mm.starts[r])[:, None] + np.arange(nbytes)
        if read:
            bad = sh[off] == 0
            if bad.any():
                j, b = np.argwhere(bad)[0]
                return ("uninitialized", int(a[sel][j]) + int(b), int(lanes[sel][j]))
        if write:
            sh[off] = 1
    return None


def _outcome(mm, a, nbytes, lanes, read, write):
    try:
        mm.check(a, nbytes, lanes, "x", read, write)
    except SanitizerError as e:
        return e.kind, str(e)
    return None


def _maps(rng):
    """Two identical memory maps: adjacent, overlapping-free ranges, some fresh with part written."""
    ranges, x = [], 4096
    for i in range(5):
        x += int(rng.integers(0, 3)) * 64
        n = int(rng.integers(64, 512))
        ranges.append((x, n, i % 2 == 0))
        x += n
    return _built(ranges, 8), _built(ranges, 8), ranges


def _reported_alike(got, want, mm, ref) -> bool:
    """Assert that the map's outcome `got` is the reference's `want` (and, with no report, that both maps
    marked the same bytes written); True when they reported."""
    if want is None:
        assert got is None
        for x, y in zip(mm.shadows, ref.shadows):
            assert (x is None) == (y is None) and (x is None or np.array_equal(x, y))
        return False
    assert got is not None and got[0] == want[0]
    assert f"{want[1]:#x}" in got[1]
    if want[0] == "uninitialized":
        assert got[1].endswith(f"in lane {want[2]}")
    return True


def _built(ranges, holes):
    """A MemoryMap over ranges (start, bytes, fresh): a fresh one has its first half written but for `holes`
    seeded bytes."""
    out = []
    for start, n, fresh in ranges:
        sh = None
        if fresh:
            sh = np.zeros(n, np.uint8)
            sh[: n // 2] = 1
            sh[np.random.default_rng(start).integers(0, n, holes)] = 0
        out.append((start, start + n, f"t{start}", sh))
    return MemoryMap(out)


@pytest.mark.parametrize("seed", range(40))
def test_memory_check_fast_path_matches_per_lane_search(seed):
    rng = np.random.default_rng(seed)
    mm, ref, ranges = _maps(rng)
    for _ in range(60):
        start, n, _ = ranges[int(rng.integers(len(ranges)))]
        nbytes = int(rng.choice([1, 2, 4, 8, 16]))
        k = int(rng.integers(1, 65))
        spread = int(rng.choice([16, n, 3 * n]))
        a = start + rng.integers(-8, spread, k)
        lanes = np.sort(rng.choice(64, k, replace=False))
        read, write = bool(rng.integers(2)), bool(rng.integers(2))
        want = _reference_check(ref, a, nbytes, lanes, read, write)
        mask = np.zeros(64, bool)
        mask[lanes] = True
        got = _outcome(mm, a, nbytes, mask if rng.integers(2) else lanes, read, write)
        if _reported_alike(got, want, mm, ref):
            mm, ref, ranges = _maps(rng)      # a report ends a launch: start over


@pytest.mark.parametrize("seed", range(20))
def test_memory_check_of_aligned_dwords_matches_per_lane_search(seed):
    """The shadow's dword-at-a-time form (whole aligned dwords in ranges starting at aligned addresses; some
    ranges start unaligned and take the byte form) against the per-lane search, reports included."""
    rng = np.random.default_rng(500 + seed)
    ranges, x = [], 4096
    for i in range(5):
        n = 4 * int(rng.integers(16, 128))
        x += 4 * int(rng.integers(0, 3)) + (1 if i == 3 else 0)
        ranges.append((x, n, i % 2 == 0 or i == 3))
        x += n
    mm, ref = _built(ranges, 4), _built(ranges, 4)
    for _ in range(80):
        start, n, _ = ranges[int(rng.integers(len(ranges)))]
        nbytes = int(rng.choice([4, 8, 12, 16]))
        k = int(rng.integers(1, 65))
        a = (start & ~3) + 4 * rng.integers(-1, n // 4 + (1 if rng.integers(4) == 0 else -3), k)
        lanes = np.sort(rng.choice(64, k, replace=False))
        read, write = bool(rng.integers(2)), bool(rng.integers(2))
        want = _reference_check(ref, a, nbytes, lanes, read, write)
        got = _outcome(mm, a, nbytes, lanes, read, write)
        if _reported_alike(got, want, mm, ref):
            mm, ref = _built(ranges, 4), _built(ranges, 4)     # a report ends a launch: start over


@pytest.mark.parametrize("seed", range(4))
def test_wide_mem_read_write_match_bytewise(seed):
    """mem_read / mem_write's one-element-a-lane forms (4, 8, 16 bytes aligned to their size) against byte
    gathers and lane-by-lane stores (a later lane wins where two overlap), aligned or not."""
    from harness.emulator.ops_memory import mem_read, mem_write

    rng = np.random.default_rng(seed)
    buf = np.zeros(8192, np.uint8)
    base = (buf.ctypes.data + 63) & ~63
    lo = base - buf.ctypes.data
    for _ in range(60):
        nbytes = int(rng.choice([1, 2, 4, 8, 12, 16]))
        align = int(rng.choice([1, 4, nbytes]))
        k = int(rng.integers(1, 65))
        off = align * rng.integers(0, (4096 - 16) // align, k)
        a = (base + off).astype(np.int64)
        data = rng.integers(0, 256, (k, nbytes), dtype=np.uint8)
        want = buf.copy()
        for j in range(k):
            want[lo + off[j]: lo + off[j] + nbytes] = data[j]
        mem_write(a, data)
        np.testing.assert_array_equal(buf, want)
        got = mem_read(a, nbytes)
        assert got.shape == (k, nbytes) and got.dtype == np.uint8
        np.testing.assert_array_equal(got, np.stack([buf[lo + o: lo + o + nbytes] for o in off]))


@pytest.mark.parametrize("seed", range(20))
def test_clean_read_is_true_only_when_every_piece_passes(seed):
    rng = np.random.default_rng(100 + seed)
    mm, ref, ranges = _maps(rng)
    for _ in range(100):
        start, n, _ = ranges[int(rng.integers(len(ranges)))]
        nbytes = int(rng.choice([4, 8, 12, 16]))
        a = start + 4 * rng.integers(-2, n // 4 + 2, int(rng.integers(1, 65)))
        pieces_ok = all(_reference_check(ref, a + 4 * j, 4, np.arange(len(a)), True, False) is None
                        for j in range(nbytes // 4))
        if mm.clean_read(a, nbytes, 4 * (nbytes // 4 - 1)):
            assert pieces_ok


@pytest.mark.parametrize("seed", range(20))
def test_bank_conflict_cache_matches_fresh_count(seed):
    rng = np.random.default_rng(200 + seed)
    C._bank_cache.clear()
    patterns = [rng.integers(0, 4096, 64) for _ in range(4)] + [np.arange(64) * 4, np.arange(64) * 8,
                                                                 np.arange(64) * 128, np.zeros(64, np.int64)]
    for _ in range(200):
        p = patterns[int(rng.integers(len(patterns)))]
        nbytes = int(rng.choice([1, 2, 4, 8, 12, 16]))
        k = int(rng.integers(1, 65))
        a = (p[:k] + int(rng.integers(0, 1 << 16))).astype(np.int64)
        c = C.Counters()
        c.lds_access(a, nbytes, write=False)
        assert c.lds_bank_conflicts == C._bank_conflicts(a, nbytes)


@pytest.mark.parametrize("seed", range(3))
def test_lds_access_rows_is_lds_access_per_row(seed):
    """A lockstep group's LDS counters (lds_access_rows over (waves, offsets, lanes) addresses) are each
    access's lds_access: bytes and bank conflicts, cached patterns or fresh; groups whose accesses are one
    pattern shifted by dwords (one lookup), or all but one."""
    rng = np.random.default_rng(300 + seed)
    for _ in range(60):
        nbytes = int(rng.choice([1, 2, 4, 8, 16]))
        shape = (int(rng.integers(1, 9)), int(rng.integers(1, 3)), 64)
        a = (rng.integers(0, 4096, shape) * int(rng.choice([1, 4])) + int(rng.integers(0, 1 << 12))).astype(np.int64)
        if rng.random() < 0.5:
            a = a[:1, :1] + 4 * rng.integers(0, 1 << 10, shape[:2] + (1,))
            if rng.random() < 0.3:
                a[-1, -1, int(rng.integers(64))] += 4 * int(rng.integers(1, 32))   # one lane off the pattern
        else:
            a[0, 0] = a[-1, -1]
        write = bool(rng.random() < 0.5)
        rows, each = C.Counters(), C.Counters()
        rows.lds_access_rows(a if shape[1] > 1 else a[:, 0], nbytes, write)
        for r in a.reshape(-1, 64):
            each.lds_access(r, nbytes, write)
        assert (rows.lds_read_bytes, rows.lds_write_bytes, rows.lds_bank_conflicts) == \
            (each.lds_read_bytes, each.lds_write_bytes, each.lds_bank_conflicts)


@pytest.mark.parametrize("compact_at,span,align,runs", [(C._COMPACT_AT, 1 << 14, 1, False), (40, 1 << 14, 1, False),
                                                         (40, 1 << 18, 4, False), (C._COMPACT_AT, 1 << 18, 1, True),
                                                         (40, 1 << 18, 4, True)])
def test_intervals_batched_merge_is_the_union(compact_at, span, align, runs, monkeypatch):
    """Dense random accesses, and sparse dword-aligned ones (touching intervals that must join, gaps),
    merged in batches (40: a merge every access or two): the union, as a byte map gives it. runs: accesses
    of contiguous lanes now and then, ascending or descending, some starting where the last one ended (the
    merge first joins intervals recorded back to back)."""
    monkeypatch.setattr(C, "_COMPACT_AT", compact_at)
    rng = np.random.default_rng(7)
    iv = C._Intervals()
    d = C._DistinctDwords()
    covered = np.zeros(span, bool)
    end = 0
    for _ in range(3000):
        nbytes = int(rng.choice([1, 2, 4, 8, 16]))
        a = rng.integers(0, span - 16, int(rng.integers(1, 65))) // align * align
        if runs and rng.random() < 0.5:
            n = int(rng.integers(1, 65))
            start = end if end + n * nbytes < span and rng.random() < 0.5 else int(rng.integers(0, span - n * nbytes))
            start = start // align * align
            a = start + nbytes * np.arange(n)
            end = int(a[-1]) + nbytes
            if rng.random() < 0.2:
                a = a[::-1]
        iv.add(a.astype(np.uint64), nbytes)
        d.add(a, nbytes)
        for x in a:
            covered[x: x + nbytes] = True
    edges = np.diff(np.concatenate([[0], covered.astype(np.int8), [0]]))
    want = np.stack([np.nonzero(edges == 1)[0], np.nonzero(edges == -1)[0]], axis=1)
    assert np.array_equal(iv.array(), want)
    dw = covered.reshape(-1, 4).any(axis=1)
    assert d.bytes() == 4 * int(dw.sum())


@pytest.mark.parametrize("seed", range(4))
def test_all_in_range_many_is_all_in_range_per_wave(seed):
    """BufferAddress.all_in_range_many (a lockstep group) against all_in_range one wave at a time: random
    descriptors (some strided), soffsets, instruction offsets, offsets near num_records, partial EXEC."""
    from types import SimpleNamespace

    from harness.emulator.ops_memory import BufferAddress
    from harness.emulator.operands import parse_operand
    from harness.emulator.state import EXEC_HI, EXEC_LO, WAVE, Wave

    rng = np.random.default_rng(seed)
    regs = np.zeros((6, 32, WAVE), np.uint32)
    wg = SimpleNamespace(lds=np.zeros(4, np.uint8), lds32=None, ids=(0, 0, 0))
    waves = []
    for k in range(6):
        w = Wave(k, wg, None, regs[k])
        w.slot = k
        w.s[8], w.s[9] = 0x10000000 + 4096 * k, int(rng.integers(0, 3)) << 16 if k == 4 else 0x12
        w.s[10], w.s[11] = int(rng.integers(1000, 5000)), 0x27000
        w.s[20] = int(rng.integers(0, 64))
        w.s[EXEC_LO], w.s[EXEC_HI] = 0xFFFFFFFF, 0xFFFFFFFF if k != 3 else 0xFFFF
        w.v[5] = rng.integers(0, w.s[10] - 40 if k % 2 else w.s[10] + 8, WAVE).astype(np.uint32)
        waves.append(w)
    seen = set()
    for uniform in (False, True, "exec"):
        if uniform is True:     # one descriptor, soffset and EXEC in every wave (all_in_range_many's shortcut)
            for w in waves:
                w.s[8:12], w.s[20] = waves[seed % 6].s[8:12], waves[seed % 6].s[20]
                w.s[EXEC_LO], w.s[EXEC_HI] = waves[1 + seed % 3].s[EXEC_LO], waves[1 + seed % 3].s[EXEC_HI]
        elif uniform == "exec":     # one raw descriptor, every lane in range, EXEC partial in wave 3 only
            for k, w in enumerate(waves):
                w.s[9] &= 0xFFFF
                w.s[EXEC_LO], w.s[EXEC_HI] = 0xFFFFFFFF, 0xFFFFFFFF if k != 3 else 0xFFFF
                w.v[5] %= np.uint32(w.s[10] - 64)
        for off in (0, 12):
            for nbytes in (1, 2, 4, 8, 12, 16):
                for soff in ("s20", "0", "0x10"):
                    inst = SimpleNamespace(mods={"offen": True, "offset": str(off)} if off else {"offen": True})
                    ba = BufferAddress(inst, [parse_operand("v5"), parse_operand("s[8:11]"), parse_operand(soff)], 0)
                    many, whole = ba.all_in_range_many(waves, nbytes)
                    many2, whole2, dw, raw = ba.all_in_range_many(waves, nbytes, lanes=True)
                    np.testing.assert_array_equal(whole, whole2)
                    for k, w in enumerate(waves):
                        full = w.s[EXEC_LO] == 0xFFFFFFFF and w.s[EXEC_HI] == 0xFFFFFFFF
                        one = ba.all_in_range(w, nbytes) if full else None
                        assert whole[k] == (one is not None), (off, nbytes, k)
                        if one is not None:
                            np.testing.assert_array_equal(many[k], one)
                        assert raw[k] == (((w.s[9] >> 16) & 0x3FFF) == 0)
                        if raw[k]:
                            addr, ok = ba.in_range(w, nbytes)
                            np.testing.assert_array_equal(many2[k], addr)
                            if dw is not None:
                                np.testing.assert_array_equal(dw[k], ok)
                    seen |= {(uniform, f) for f in whole.tolist()}
    assert {(False, True), (False, False), (True, False), ("exec", True), ("exec", False)} <= seen


class _PlainShadow:
    """Per LDS byte: the last writer wave and its barrier epoch, the waves that read it and their epoch."""

    def __init__(self, size):
        self.size, self.epoch = size, 0
        self.w_wave = np.full(size, -1, np.int16)
        self.w_epoch = np.full(size, -1, np.int32)
        self.r_mask = np.zeros(size, np.uint64)
        self.r_epoch = np.full(size, -1, np.int32)


def _reference_lds_access(sh, wave, idx, write, what):
    """The plain race check of one access as it completes (byte indices; those outside the LDS ignored):
    every check on every access, against every earlier access of the epoch."""
    idx = idx[(idx >= 0) & (idx < sh.size)]
    if not idx.size:
        return
    e = sh.epoch
    other_w = (sh.w_epoch[idx] == e) & (sh.w_wave[idx] != wave)
    bit = np.uint64(1 << wave)
    if write:
        other_r = (sh.r_epoch[idx] == e) & ((sh.r_mask[idx] & ~bit) != 0)
        bad = other_w | other_r
        if bad.any():
            j = int(np.argmax(bad))
            if other_w[j]:
                who = f"written by wave {int(sh.w_wave[idx[j]])}"
            else:
                m = int(sh.r_mask[idx[j]]) & ~(1 << wave)
                who = f"read by wave {(m & -m).bit_length() - 1}"
            raise SanitizerError("lds-race", f"{what} writes LDS byte {int(idx[j])}, {who} with no s_barrier "
                                             f"in between")
        sh.w_wave[idx] = wave
        sh.w_epoch[idx] = e
    else:
        if other_w.any():
            j = int(np.argmax(other_w))
            raise SanitizerError("lds-race", f"{what} reads LDS byte {int(idx[j])}, written by wave "
                                             f"{int(sh.w_wave[idx[j]])} with no s_barrier in between")
        stale = sh.r_epoch[idx] != e
        if stale.any():
            s = idx[stale]
            sh.r_mask[s] = 0
            sh.r_epoch[s] = e
        sh.r_mask[idx] = sh.r_mask[idx] | bit


def test_lds_epoch_check_reads_of_partly_written_dwords():
    """A dword read meets bytes of a dword only some of which were written (byte records): no race when
    they are the reader's own, a race when another wave wrote one (the dword-wide check goes byte by byte
    there)."""
    def epoch(reader, second_byte):
        sh = LdsShadow(64)
        sh.record(0, *lds_record(True, np.array([1]), 1, 64))                 # wave 0 writes byte 1
        sh.record(1, *lds_record(True, np.array([second_byte]), 1, 64))       # wave 1 writes another byte
        sh.record(reader, *lds_record(False, np.array([0]), 4, 64), where=7)  # a dword read of bytes 0..3
        return sh.end_epoch()
    assert epoch(0, 40) is None
    assert "reads LDS byte 1, written by wave 0" in str(epoch(1, 40))
    assert "reads LDS byte 2, written by wave 1" in str(epoch(0, 2))


@pytest.mark.parametrize("seed,check_at", [(s, san.CHECK_AT) for s in range(6)] + [(s, 3) for s in range(6, 9)])
def test_lds_epoch_check_reports_what_access_by_access_does(seed, check_at, monkeypatch):
    """Random epochs of waves 0..15 reading and writing overlapping bytes (dword records of aligned whole
    dwords, byte records of any size, lanes outside the LDS, duplicate lanes): the epoch's check (at its end,
    or early as its records grow) reports exactly when the plain check of each access as it completes
    reports in that epoch, with the same text, naming the same access and where it completed; the stamps
    are clear after every epoch."""
    monkeypatch.setattr(san, "CHECK_AT", check_at)
    rng = np.random.default_rng(seed)
    size = 96
    races = clean = dword_races = early = 0
    for stream in range(80):
        fast, plain = LdsShadow(size), _PlainShadow(size)
        for epoch in range(int(rng.integers(1, 5))):
            want = None
            units = set()
            got = None
            for step in range(int(rng.integers(1, 10))):
                wave = int(rng.integers(0, 16))
                write = bool(rng.random() < 0.3)
                lanes = int(rng.integers(1, 6))
                if rng.random() < 0.5:
                    nbytes = 4 * int(rng.integers(1, 5))
                    a = 4 * rng.integers(0, (size - nbytes) // 4 + 1, lanes)
                else:
                    nbytes = int(rng.integers(1, 17))
                    a = rng.integers(-8, size, lanes)
                w_, idx, unit = lds_record(write, a, nbytes, size)
                units.add(unit)
                if want is None:
                    whole = a[(a >= 0) & (a + nbytes <= size)]           # lanes the access does not drop
                    try:
                        _reference_lds_access(plain, wave, (whole[:, None] + np.arange(nbytes)).ravel(), write,
                                              f"pc {step:#x}")
                    except SanitizerError as e:
                        want = (str(e), 100 + step)
                try:
                    fast.record(wave, w_, idx, unit, None, pc=step, where=100 + step)
                except SanitizerError as e:
                    got = e
                    early += 1
                    break
            if got is None:
                got = fast.end_epoch()
            assert not fast.owner.any(), (stream, epoch)
            assert (got is None) == (want is None), (stream, epoch, got, want)
            if got is not None:
                assert (str(got), got.at_pc) == want, (stream, epoch)
                races += 1
                dword_races += 4 in units
                break
            clean += 1
            plain.epoch += 1
    assert races > 20 and clean > 20 and dword_races > 5, (races, clean, dword_races)
    assert (early > 5) == (check_at < 10), early


def test_lds_record_is_the_access_bytes():
    """lds_record: aligned whole dwords inside the LDS as dword indices, anything else as its bytes inside the
    LDS, in lane then byte order (what a report names follows it)."""
    a = np.array([8, 0, 8], np.int64)
    w, idx, unit = lds_record(True, a, 8, 64)
    assert w and unit == 4 and idx.tolist() == [2, 3, 0, 1, 2, 3]
    _, idx, unit = lds_record(False, a + 2, 4, 64)
    assert unit == 1 and idx.tolist() == [10, 11, 12, 13, 2, 3, 4, 5, 10, 11, 12, 13]
    _, idx, unit = lds_record(False, np.array([60, -2, 62, 1]), 4, 64)     # lanes not inside are dropped
    assert unit == 1 and idx.tolist() == [60, 61, 62, 63, 1, 2, 3, 4]
    _, idx, unit = lds_record(False, np.array([60, -4, 64]), 4, 64)
    assert unit == 4 and idx.tolist() == [15]
    _, idx, unit = lds_record(False, np.array([[0, 4], [16, 20]]), 4, 64, inside=True)   # one row per wave
    assert unit == 4 and idx.tolist() == [[0, 1], [4, 5]]
