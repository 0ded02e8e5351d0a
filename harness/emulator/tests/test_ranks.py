"""Several emulated GPUs (harness/emulator/ranks.py): IPC memory, cross-process atomics, hang reports."""

from __future__ import annotations

import pytest

from harness.emulator import ranks
from harness.emulator.tests import rank_programs as progs


def test_ranks_exchange_flags_through_ipc_memory_and_count_with_system_atomics():
    results = ranks.run(progs.flag_exchange, world=progs.WORLD, args=(None, 3), timeout=120)
    for r, res in enumerate(results):
        assert res["flags"] == [3] * progs.WORLD, f"rank {r} saw {res['flags']}"
        # 4 ranks x 3 rounds x 64 lanes of one wave, each lane one atomic add on rank 0's page
        assert res["counter"] == progs.WORLD * 3 * 64


def test_ranks_start_with_the_fork_servers_imports():
    """torch._dynamo (which a rank's first custom-op call would import) is there before the program runs:
    no rank pays the heavy imports, the fork server did once."""
    results = ranks.run(progs.preloaded, world=2, args=(ranks.PRELOAD,), timeout=60)
    for r, res in enumerate(results):
        assert res == {n: True for n in ranks.PRELOAD}, f"rank {r}: {res}"


def test_a_rank_that_never_arrives_is_a_hang_report_not_a_stuck_test(monkeypatch):
    monkeypatch.setenv(ranks.TIMEOUT_ENV, "4")
    with pytest.raises(ranks.RankFailed) as err:
        ranks.run(progs.flag_exchange, world=progs.WORLD, args=(3, 1), timeout=4)
    msg = str(err.value)
    assert "rank 0" in msg and "RankHang" in msg and "workgroup (0, 0, 0)" in msg, msg
    assert "pc 0x" in msg and "last system-scope load" in msg and "read 0" in msg, msg


def test_the_hang_clock_runs_only_while_a_wave_waits_on_one_unchanged_flag():
    """Rank 0 waits 3 x 3 s for its three staggered peers in each of two launches, longer than the 8 s
    timeout in all, but each flag arrives within 3 s: no hang. (The clock once ran from a wave's first
    sleep in any earlier launch whose state object had the same id(), a spurious RankHang under load.)"""
    results = ranks.run(progs.flag_exchange, world=progs.WORLD, args=(None, 3, 3.0), timeout=8)
    for r, res in enumerate(results):
        assert res["flags"] == [3] * progs.WORLD, f"rank {r} saw {res['flags']}"
