"""Token-sampled emulator runs of the MoE pipeline (kernel.toml `workgroups = "tokens"`) are faithful:

- the sampled rows come out byte-identical to a run of every workgroup, and only those rows are stored;
- a sample that leaves out a tile the rows need does not pass quietly: the memory guard reports the
  combine reading never-written bytes.
"""

from __future__ import annotations

import functools

import pytest
import torch

from harness import checks, discovery
from harness import device as devices
from references import OPS

PACKAGE = "moe/mxfp4_h2880_i384_e128_top4"
TOKENS = 16
SAMPLED = frozenset({2, 11})

pytestmark = pytest.mark.skipif(not devices.current().emulated, reason="emulator sampling (no GPU equivalent)")


@pytest.fixture(scope="module")
def case():
    pkg = discovery.discover()[PACKAGE]
    name = pkg.entry_for_op("moe_mxfp4_gptoss")
    entry = pkg.import_entries()[name]
    dims = {"hidden": 2880, "intermediate": 2880, "experts": 128, "top_k": 4, "tp_size": 8, "tp_rank": 1}
    inputs = pkg.entry_inputs(name, OPS["moe_mxfp4_gptoss"].build_inputs(TOKENS, dims, 5))
    module = __import__(pkg.module, fromlist=["emulator_workgroups"])
    return entry, inputs, module.emulator_workgroups


def test_sampled_rows_match_a_full_run(case):
    entry, inputs, chooser = case
    (full,), _ = checks._run(entry, inputs, order_seed=None, sample={})
    sample = dict(workgroup_filter=functools.partial(chooser, SAMPLED))
    (part,), records = checks._run(entry, inputs, order_seed=7, sample=sample)
    stored = checks.stored_mask(records, part).all(dim=1)
    assert stored.nonzero().flatten().tolist() == sorted(SAMPLED)
    rows = torch.tensor(sorted(SAMPLED))
    assert torch.equal(checks.row_bytes(part)[rows], checks.row_bytes(full)[rows])
    down = [r for r in records if r.kernel_name.endswith("_down")]
    assert down and len(down[0].workgroups_executed) < down[0].grid[0] * down[0].grid[1]


def test_a_sample_missing_a_tile_is_reported(case):
    from harness import emulator

    entry, inputs, chooser = case

    def drop_last_down_tile(tokens, kernel, grid, pointers, read):
        chosen = chooser(tokens, kernel, grid, pointers, read)
        if kernel.endswith("_down"):
            last = max(x for x, _, _ in chosen)
            chosen = {wg for wg in chosen if wg[0] != last}
        return chosen

    sample = dict(workgroup_filter=functools.partial(drop_last_down_tile, SAMPLED))
    with pytest.raises(emulator.SanitizerReport, match="never-written"):
        checks._run(entry, inputs, order_seed=None, sample=sample)
