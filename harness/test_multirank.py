"""Multi-rank kernels (kernel.toml `ranks = n`), generated from the regimes: every case on n ranks, all ranks
bitwise equal and matching the reference (harness/multirank.py).

Starting n rank processes costs more than a case, so the first case of an (op, shape) runs all of that
shape's selected token counts in one set of rank processes and the others read its results. The cases of a
shape form one xdist group (the README's command runs `--dist loadgroup`), so they share one worker's results:
split over two workers, each paid the shape's rank run (ci36: 260 -> 537 CPU-s for the 18 cases).
"""

from __future__ import annotations

import os

import pytest

from harness import cases, checks, discovery, multirank
from harness import device as devices
from references import OPS

PACKAGES = discovery.discover()
SHAPES = [s for s in cases.op_shapes() if s.kernel in PACKAGES and PACKAGES[s.kernel].ranks > 1]
FULL = os.environ.get("AMD_KERNELS_FULL", "") not in ("", "0")


def _runs(shape, count) -> bool:
    return FULL or PACKAGES[shape.kernel].checked_by_default(shape.op, count.tokens, devices.current().emulated)


def _param(shape, count):
    marks = [pytest.mark.xdist_group(f"multirank-{shape.id}")]
    if not _runs(shape, count):
        marks.append(pytest.mark.skip(reason=f"emulator: {count.tokens} tokens is outside kernels/{shape.kernel}"
                                      "'s emulated set; AMD_KERNELS_FULL=1 runs it"))
    return pytest.param(shape, count, id=f"{shape.kernel}:{shape.op}:m{count.tokens}r{count.real}", marks=marks)


CASES = [_param(shape, count) for shape in SHAPES for count in shape.token_counts]
_results: dict = {}


def _seed(shape, count) -> int:
    return checks.seed_of(shape.id, count.tokens, count.real) % 100_000


def _result(shape, count) -> multirank.MultiRankResult:
    if shape.id not in _results:
        pkg = PACKAGES[shape.kernel]
        counts = [c for c in shape.token_counts if _runs(shape, c)]
        triples = [(c.tokens, c.real, _seed(shape, c)) for c in counts]
        results = multirank.check_cases(pkg.module, pkg.entry_for_op(shape.op), shape.op, shape.dims, triples,
                                        world=pkg.ranks, sample_above=pkg.sample_above(shape.op))
        _results[shape.id] = {(c.tokens, c.real): r for c, r in zip(counts, results)}
    return _results[shape.id][(count.tokens, count.real)]


@pytest.mark.parametrize("shape,count", CASES)
def test_multirank(shape, count):
    result = _result(shape, count)
    assert result.failures(OPS[shape.op].cosine_min) == [], result


@pytest.mark.parametrize("shape", list({(s.kernel, s.op): s for s in SHAPES}.values()), ids=lambda s: s.id)
def test_isa_cards(shape):
    """Every variant the entry can hit compiles for gfx950 with no scratch and no rule violation."""
    from harness.isa import cards, code_object_of

    pkg = PACKAGES[shape.kernel]
    entry = pkg.import_entries()[pkg.entry_for_op(shape.op)]
    entry.warm_up()
    keys = sorted({k for ks in entry.modes.values() for k in ks})
    assert keys
    for key in keys:
        for card in cards(code_object_of(entry.table[key])):
            assert card.violations() == [], f"{key}: {card}"


@pytest.mark.parametrize("pkg", [p for p in PACKAGES.values() if p.ranks > 1], ids=lambda p: p.path)
def test_the_workgroup_named_for_a_row_produces_it(pkg):
    """A sampled run adds the workgroup holding the last real row (multirank._cases): the package's
    emulator_workgroup_of_row must name one whose emulator_rows hold the row, and every row those hold must name
    that workgroup back (else it named an id past the grid whose rows merely look right), in both tiers."""
    import importlib

    mod = importlib.import_module(pkg.module)
    for tokens in (1, 7, 183, 184, 190, 600, 4100, 8192):
        tier = mod.tier(tokens)
        for row in range(tokens):
            wg = mod.emulator_workgroup_of_row(tokens, tier, row)
            rows = mod.emulator_rows(tokens, tier, [wg])
            assert row in rows and {mod.emulator_workgroup_of_row(tokens, tier, r) for r in rows} == {wg}


BAD_INPUT_PACKAGES = [p for p in PACKAGES.values()
                      if p.ranks > 1 and "allreduce_fused_add_rmsnorm" in p.entries.values()]


@pytest.mark.parametrize("pkg", BAD_INPUT_PACKAGES, ids=lambda p: p.path)
def test_entry_before_the_communicator_exists_says_so(pkg, monkeypatch):
    import importlib

    import torch

    from amd_kernels.comm import communicator

    monkeypatch.setattr(communicator, "_current", None)
    entry = importlib.import_module(pkg.module).allreduce_fused_add_rmsnorm
    x = torch.zeros(1, 2880, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="no communicator in this process"):
        entry(x, x.clone(), torch.ones(2880, dtype=torch.bfloat16), 1e-5)


@pytest.mark.parametrize("pkg", BAD_INPUT_PACKAGES, ids=lambda p: p.path)
def test_fakes_trace_without_a_communicator(pkg, monkeypatch):
    """torch.compile traces a multi-rank entry with its fake, which needs no communicator: outputs of the
    entry's shapes and dtypes, and a bad argument's error (the entry's own checks) at trace time."""
    import importlib

    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from amd_kernels.comm import communicator

    monkeypatch.setattr(communicator, "_current", None)
    mod = importlib.import_module(pkg.module)
    hidden = int(next(s.dims["hidden"] for s in SHAPES if s.kernel == pkg.path))
    with FakeTensorMode():
        x = torch.empty(5, hidden, dtype=torch.bfloat16)
        w = torch.empty(hidden, dtype=torch.bfloat16)
        out = mod.allreduce(x)
        assert (out.shape, out.dtype) == (x.shape, x.dtype)
        out, res = mod.allreduce_fused_add_rmsnorm(x, x.clone(), w, 1e-5)
        assert [(t.shape, t.dtype) for t in (out, res)] == [(x.shape, x.dtype)] * 2
        q, scales, res = mod.allreduce_fused_add_rmsnorm_mxfp8(x, x.clone(), w, 1e-5)
        assert [(t.shape, t.dtype) for t in (q, scales, res)] == [
            (x.shape, torch.float8_e4m3fn), ((5, hidden // 32), torch.uint8), (x.shape, x.dtype)]
        for entry in (mod.allreduce_fused_add_rmsnorm, mod.allreduce_fused_add_rmsnorm_mxfp8):
            with pytest.raises(TypeError, match="^weight: "):
                entry(x, x.clone(), w.float(), 1e-5)


@pytest.mark.skipif(not devices.current().emulated, reason="the absent-rank hang report is the emulator's")
@pytest.mark.parametrize("pkg", BAD_INPUT_PACKAGES, ids=lambda p: p.path)
def test_bad_inputs_across_ranks(pkg):
    import importlib

    from harness.emulator import ranks

    dims = {"hidden": 2880, "eps": 1e-5, "ranks": pkg.ranks}
    edge = importlib.import_module(pkg.module).TWO_STAGE_MIN_TOKENS  # the worker's buffer holds edge tokens
    results = ranks.run(multirank.bad_input_worker, world=pkg.ranks, args=(pkg.module, dims), timeout=6)
    for rank, res in enumerate(results):
        assert res["sizes"] and "ValueError" in res["sizes"] and "max_tokens" in res["sizes"], (rank, res)
        too_many = res["too_many_tokens"] or ""
        assert too_many.startswith(f"ValueError: x: {edge + 1} tokens") \
            and f"registered buffer of {edge} tokens" in too_many, (rank, res)
        assert res["dtype"] and res["dtype"].startswith("TypeError: residual:"), (rank, res)
        assert res["fake_dtype"] == res["dtype"], (rank, res)  # the fake runs the entry's checks
        uneven = res["uneven_tokens"] or ""
        assert uneven.startswith("ValueError: x:") and "rank 0" in uneven and "(3 tokens)" in uneven, (rank, res)
        rank_dtype = res["rank_dtype"] or ""  # rank 1 passed float32: every rank says so (none waits)
        assert rank_dtype.startswith("ValueError: x:") and "torch.float32" in rank_dtype, (rank, res)
        assert "rank 1 called" in rank_dtype and "bfloat16" in rank_dtype, (rank, res)
        if rank == pkg.ranks - 1:
            assert "absent_rank" not in res and "absent_rank_two_stage" not in res
        else:
            for key in ("absent_rank", "absent_rank_two_stage"):
                msg = res[key] or ""
                assert "RankHang" in msg and f"rank {rank}" in msg and "last system-scope load" in msg, (rank, key, msg)


def test_the_judge_catches_a_rank_that_differs_and_a_wrong_sum():
    """multirank's comparison (no processes): one flipped bit on one rank, or on all of them, fails."""
    import torch

    from references import allreduce as ar

    dims = {"hidden": 2880, "ranks": 8}
    inputs = OPS["allreduce"].build_inputs(3, dims, 9)
    (good,) = ar.allreduce(inputs["x"])
    runs = [{"runs": [(good.clone(),), (good.clone(),)], "counters": [], "compiles_after_warm_up": []}
            for _ in range(8)]
    assert multirank._judge("allreduce", dims, 3, 3, 9, runs).failures(0.99999) == []
    bad = good.clone()
    bad.view(torch.int16)[1, 7] ^= 1
    runs[3]["runs"][0] = (bad,)
    assert "ranks returned different bytes" in multirank._judge("allreduce", dims, 3, 3, 9, runs).failures(0.99999)
    runs = [{"runs": [(bad,)] * 2, "counters": [], "compiles_after_warm_up": []}] * 8  # all agree, all wrong
    fails = multirank._judge("allreduce", dims, 3, 3, 9, runs).failures(0.99999)
    assert fails == ["sum: not bitwise equal to the reference"]
    # one rank saw other bytes across the tier edge
    runs = [{"runs": [(good.clone(),)] * 2, "counters": [], "compiles_after_warm_up": [],
             "tier_edge_equal": r != 5} for r in range(8)]
    fails = multirank._judge("allreduce", dims, 3, 3, 9, runs).failures(0.99999)
    assert fails == ["the same rows gave other bytes just below and at the tier edge"]
    # sampled rows: only those are compared with the reference (rows 1 and 2 of 3 here)
    runs = [{"runs": [(good[[1, 2]].clone(),)] * 2, "counters": [], "compiles_after_warm_up": [], "rows": [1, 2]}
            for _ in range(8)]
    res = multirank._judge("allreduce", dims, 3, 3, 9, runs)
    assert res.failures(0.99999) == [] and res.rows_checked == [1, 2] and res.rows_real == 2
    runs[0] = {**runs[0], "runs": [(good[[0, 2]].clone(),)] * 2}  # rank 0's rows are not the rows it names
    assert "sum: not bitwise equal to the reference" in multirank._judge("allreduce", dims, 3, 3, 9, runs).failures(1)
