"""The MoE prefill tiers (kernels/moe/mxfp4_moe/prefill.py) on a small shape built for them: each tier's output
must be bitwise the 16-row tier's on the same inputs. The routing puts three quarters of the tokens' first
slot on expert 0 (with its random picks in the other rows, more than one full super-tile and a partial one in
either tier: the test counts them from the ids), the rest spread, one id out of range (dropped); the gate-up
K has a tail (hidden 2880 in 23 K-steps), the intermediate has dead columns (a TP rank's padding), and the K
grouping is the TP8 package's, one group, or h6144's (fixture `pipeline`). The regime shapes' edges are checked by
test_batch_invariance."""

from __future__ import annotations

import contextlib

import pytest
import torch

from harness import device as devices

E, TOP_K, DEAD, M = 8, 4, 192, 200


# (hidden, IP, small_m_waves). With a small-M tier (8 waves) the gate-up sums K in groups of chunks (three
# accumulator sets: the 128-row tier's gate-up stages one K-step per barrier), without in one group (two sets,
# two K-steps). h6144's grouping (3 chunks a group) gives 12 gate-up groups, which 8 waves stage in two rounds
# with spare slots (prefill.slots); down's 20 groups (hidden 2880) do so too.
@pytest.fixture(scope="module", params=[(2880, 384, 8), (2880, 384, 0), (6144, 768, 8)],
                ids=["group2", "group1", "h6144"])
def pipeline(request):
    from amd_kernels import warm_up
    from amd_kernels.moe import mxfp4_moe

    hidden, ip, small_m = request.param
    name = f"test_moe_prefill_{hidden}_{small_m}"
    p = mxfp4_moe.build(hidden, ip, E, TOP_K, "gptoss", name, small_m_waves=small_m, prefill_from=256)
    return p, warm_up.VariantTable(f"harness.{name}", {k: warm_up.Variant(*v) for k, v in p.variants.items()})


def _inputs(p, dev):
    from amd_kernels.moe import prepare

    g = torch.Generator().manual_seed(0)
    w = {}
    for k, s in p.weight_shapes().items():
        if k in ("w13", "w2"):  # random E2M1 codes
            w[k] = torch.randint(0, 256, s, generator=g, dtype=torch.int32).to(prepare.WEIGHT_DTYPES[k])
        elif k.endswith("scale"):  # E8M0 around 2^-7
            w[k] = torch.randint(118, 124, s, generator=g, dtype=torch.int32).to(prepare.WEIGHT_DTYPES[k])
        elif k.endswith("bias"):
            w[k] = torch.randn(s, generator=g) * 0.1
    w["shard"] = torch.tensor([0, p.geometry.ip - DEAD, 1, 0], dtype=torch.int32)
    ids = torch.stack([torch.randperm(E, generator=g)[:TOP_K] for _ in range(M)]).to(torch.int32)
    for i in range(3 * M // 4):  # expert 0 hot: 150 pairs here, more from the other rows' random picks
        ids[i] = torch.cat([torch.zeros(1, dtype=torch.int32), 1 + torch.randperm(E - 1, generator=g)[:TOP_K - 1]])
    ids[3, TOP_K - 1] = E + 5
    x = torch.randn(M, p.geometry.hidden, generator=g).to(torch.bfloat16)
    tw = torch.rand(M, TOP_K, generator=g)
    return {k: v.to(dev) for k, v in w.items()}, x.to(dev), tw.to(dev), ids.to(dev)


@pytest.mark.parametrize("tier", ["moe.prefill", "moe.prefill128"])
def test_prefill_bitwise_equal_to_the_16_row_tier(pipeline, tier):
    _check_tier(*pipeline, tier)


def test_prefill_tiers_right_when_llvm_keeps_every_lsr_solution(request):
    """The same check on code objects compiled under LLVM's lsr-drop-solution=false (the state FlyDSL's
    llvm_options restore leaves a process in, kernels/llvm_state.py). There the scan's last add once sank into
    quant_sort's lane-0 branch, whose readlane of lane 63 then read a partial sum: no super-tiles, both prefill
    tiers computed nothing. A kernel whose bits follow such a codegen choice reads undefined lanes."""
    import flydsl.compiler as flyc
    from flydsl.compiler.kernel_function import CompilationContext

    from amd_kernels import warm_up
    from amd_kernels.moe import mxfp4_moe
    from harness import own_process
    from harness.isa import code_object_of

    if not own_process.runs_here(request):  # the option stays changed in the process that compiled under it
        return
    name = "test_moe_prefill_lsr"
    p = mxfp4_moe.build(2880, 384, E, TOP_K, "gptoss", name, small_m_waves=8, prefill_from=256)
    table = warm_up.VariantTable(f"harness.{name}", {k: warm_up.Variant(*v) for k, v in p.variants.items()})
    prefill = table.variants["moe.prefill"]
    default = code_object_of(flyc.compile(prefill.launcher, *prefill.example_args()))  # before any option is set
    for key in ("moe.full", "moe.prefill", "moe.prefill128"):  # their own cache keys: the options are in them
        variant = table.variants[key]
        with CompilationContext.compile_hints({"llvm_options": {"lsr-drop-solution": False}}):
            table._loaded[key] = flyc.compile(variant.launcher, *variant.example_args())
    assert code_object_of(table._loaded["moe.prefill"]) != default, \
        "the option no longer changes this code: the test checks nothing the tier test does not"
    sanitized = contextlib.nullcontext()
    if devices.current().emulated:  # the emulator's "lanes" detector names the read of a skipped lane
        from harness import emulator

        sanitized = emulator.options(sanitize=True)
    with sanitized:
        for tier in ("moe.prefill", "moe.prefill128"):
            _check_tier(p, table, tier)


def _check_tier(p, table, tier):
    from amd_kernels.moe.mxfp4_moe import prefill

    assert p.variant_for(256) == "moe.prefill" and p.variant_for(255) != "moe.prefill"
    assert prefill.gate_up_steps(p.geometry, 8) == (1 if p.geometry.small_m_waves else 2)
    dev = devices.current().torch_device
    w, x, tw, ids = _inputs(p, dev)
    hot_tiles = -(-int((ids == 0).sum()) // 16)
    assert all(hot_tiles > w and hot_tiles % w for w in prefill.WAVES), \
        f"expert 0's {hot_tiles} tiles: both full and partial super-tiles in each tier"
    outs = {}
    for key in ("moe.full", tier):
        out = torch.zeros_like(x)
        table[key](*p.launch_args(key, x, tw, ids, w, out, dev), None)
        outs[key] = out.cpu()
    full, pre = (outs[k].view(torch.int16) for k in ("moe.full", tier))
    assert (outs["moe.full"] != 0).any(dim=1).all(), "a row of the 16-row tier's output is all zero"
    differ = (full != pre).any(dim=1)
    assert not differ.any(), f"rows {differ.nonzero().flatten().tolist()[:10]} differ between the tiers"
