"""`harness run`'s selection of token counts (harness/cli.py plan), checked without running a kernel: by
default the counts CI checks (each package's kernel.toml [emulator] sets, read here straight from the
TOML), with --all every regime count, on a GPU every count."""

from __future__ import annotations

import io
import os
import tomllib

import pytest

from harness import cases, cli, progress
from harness.discovery import KERNELS_DIR
from harness.regimes import REGIMES_DIR

REGIMES = sorted(REGIMES_DIR.glob("*.toml"))


def _toml_set(kernel: str, op: str) -> tuple[set, int]:
    """The counts kernels/<kernel>/kernel.toml lists for `op` (empty: none listed), and its bound on the rest
    (token_counts_up_to; 0: none, every count runs)."""
    emu = tomllib.loads((KERNELS_DIR / kernel / "kernel.toml").read_text()).get("emulator", {})
    return set(emu.get("op_token_counts", {}).get(op, emu.get("token_counts", ()))), emu.get("token_counts_up_to", 0)


@pytest.mark.parametrize("regime", REGIMES, ids=lambda p: p.stem)
def test_default_is_the_kernel_toml_sets(regime):
    work = cli.plan(regime, emulated=True)
    assert [s for s, _, _ in work] == cases.op_shapes([regime.stem])
    for shape, _, counts in work:
        subset, up_to = _toml_set(shape.kernel, shape.op)
        want = [c for c in shape.token_counts
                if c.tokens in subset or not subset and (not up_to or c.tokens <= up_to)]
        assert counts == want, shape.id


def test_some_package_lists_a_set_and_some_a_bound():
    """Else test_default_is_the_kernel_toml_sets would show nothing of one of the two forms."""
    forms = [_toml_set(shape.kernel, shape.op) for shape in cases.op_shapes()]
    assert any(subset for subset, _ in forms)
    assert any(up_to and not subset for subset, up_to in forms)


@pytest.mark.parametrize("regime", REGIMES, ids=lambda p: p.stem)
def test_all_and_gpu_select_every_count(regime):
    for work in (cli.plan(regime, every=True, emulated=True), cli.plan(regime, emulated=False)):
        assert [(s, list(s.token_counts)) for s, _, _ in work] == [(s, c) for s, _, c in work]
    narrowed = cli.plan(regime, tokens={1, 2}, emulated=True)  # picked counts run, listed in a set or not
    assert [[c for c in s.token_counts if c.tokens in (1, 2)] for s, _, _ in narrowed] == [c for *_, c in narrowed]


def test_only_narrows_to_kernels_or_an_op():
    regime = REGIMES_DIR / "gpt_oss_120b.toml"
    gemm = cli.plan(regime, only="gemm/")
    assert gemm and all(s.kernel.startswith("gemm/") for s, _, _ in gemm)
    assert [s.op for s, _, _ in cli.plan(regime, only="mxfp8_quant")] == ["mxfp8_quant"] * 2


def test_default_is_smaller_where_a_set_is_listed():
    regime = REGIMES_DIR / "gpt_oss_120b.toml"
    every = sum(len(c) for *_, c in cli.plan(regime, every=True))
    default = sum(len(c) for *_, c in cli.plan(regime))
    assert 0 < default < every


def test_progress_estimates_from_this_run_and_the_last(tmp_path):
    shapes = [("a:op", "{}", [(1, 1), (8, 5)]), ("b:op", "{}", [(1, 1)])]
    times = tmp_path / "times.json"
    bar = progress.Progress(shapes, stream=io.StringIO(), times_path=times)
    assert bar.seconds_left() is None and bar.total_cases == 3
    bar.warmed("a:op", "{}", 4.0)
    bar.done("a:op", "{}", (1, 1), 2.0)
    # left: a m8 (a's mean 2), b's warm-up (the mean warm-up 4), b m1 (the mean of every case 2)
    assert bar.seconds_left() == pytest.approx(8.0, abs=0.5)  # less what the running one has run
    assert "1/3 cases" in bar.line()
    again = progress.Progress(shapes, stream=io.StringIO(), times_path=times)
    assert again.seconds_left() == pytest.approx(4.0 + 2.0 + 2.0 + 4.0 + 2.0, abs=0.5)  # last run, means
    jobs = progress.Progress(shapes, stream=io.StringIO(), times_path=times, jobs=2)
    assert jobs.seconds_left() == pytest.approx(4.0 + 4.0 + (2.0 + 2.0 + 2.0) / 2, abs=0.5)  # cases 2 at a time


def _rows(text: str) -> list[str]:
    """The result rows of a `harness run` output (cli.ROW, or cli.PARALLEL_ROW's case column and cli.ROW),
    without the timing columns s and cpu s."""
    starts, at = {}, 0
    for name, width in cli.ROW:
        starts[name] = at
        at += width + 2
    case_width = cli.PARALLEL_ROW[0][1] + 2
    out = []
    for line in text.splitlines():
        row = line[case_width:] if " @ " in line[:case_width] else line
        if not row[:1].isdigit() or " token counts" in row:
            continue  # a header, an ISA card, a title, the count line
        out.append(row[:starts["s"]].rstrip() + " | " + row[starts["cosine"]:].rstrip())
    return out


def test_jobs_run_the_same_cases_with_the_same_results(capsys):
    """--jobs 2 runs the single-rank cases in worker processes: every case once, the same results as in
    one process (this executes the quant kernels at 1 and 8 tokens)."""
    argv = ["run", str(REGIMES_DIR / "gpt_oss_120b.toml"), "--only", "quant/", "--tokens", "1,8"]
    assert cli.main(argv + ["--jobs", "1"]) == 0
    serial = _rows(capsys.readouterr().out)
    assert cli.main(argv + ["--jobs", "2"]) == 0
    parallel = _rows(capsys.readouterr().out)
    assert serial and sorted(serial) == sorted(parallel), (serial, parallel)
    with pytest.raises(SystemExit, match="--jobs: expected a positive"):
        cli.main(argv + ["--jobs", "0"])
    assert cli.default_jobs(emulated=False) == 1  # a GPU's cases share the device
    assert 1 <= cli.default_jobs(emulated=True) <= (os.cpu_count() or 1)
