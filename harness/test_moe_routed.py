"""The routed MoE entry (router weights + hidden states) against the path it replaces, bit for bit: the route
package's `route`, then the MoE package's `moe` (route launch + four MoE launches), against `routed` (at decode
sizes three launches: the router split over experts with the activation quantization and the sort, by
tickets, in the first; gate-up; down with the combine folded in: mxfp4_moe/fused.py). The routed call runs
under the sanitizer and the memory guard, in a seeded workgroup order (the tickets pick other last
workgroups). Token counts: 1; the TP8 gate-up tier edge (small_m | full at 5 | 6: CI runs 6, AMD_KERNELS_FULL=1
also 5; test_kernels' routed cases at 4 tokens run small_m); a router tile edge (17 = 16 + 1: two tiles, the
second holding one real row); the prefill tier (4 launches: the router's also writing the super-tile table)
forced at 17 tokens, and at 256 through the entry (AMD_KERNELS_FULL=1). Heavy (emulated MoE calls): run this
file alone, without -n."""

from __future__ import annotations

import importlib
import os
import pytest
import torch

from harness import checks, discovery
from harness import device as devices
from references.moe import build_routed_moe_inputs

GPTOSS = {"hidden": 2880, "intermediate": 2880, "experts": 128, "top_k": 4}
ROUTER = "moe/route_h2880_e128_top4"
TP8 = "moe/mxfp4_h2880_i384_e128_top4"
FULL = os.environ.get("AMD_KERNELS_FULL", "") not in ("", "0")
# CI runs the TP8 cases (both gate-up tiers, both sides of the router's tile edge); the TP1 case (the same
# launches at another geometry, its routed op checked against the reference in test_kernels at 4 tokens)
# costs ~2 CPU-minutes: FULL only.
CASES = [(TP8, 8, 7, 1), (TP8, 8, 7, 6), (TP8, 8, 7, 17),
         pytest.param(TP8, 8, 7, 5, marks=pytest.mark.skipif(not FULL, reason="AMD_KERNELS_FULL=1 runs it")),
         pytest.param("moe/mxfp4_h2880_i2880_e128_top4", 1, 0, 2,
                      marks=pytest.mark.skipif(not FULL, reason="TP1: AMD_KERNELS_FULL=1 runs it")),
         # 256 tokens, the largest count of TP8's fused.full (its prefill tier from 512), emulated whole
         pytest.param(TP8, 8, 7, 256,
                      marks=pytest.mark.skipif(not FULL, reason="256 tokens whole: AMD_KERNELS_FULL=1 runs it"))]


def _routed_against_route_then_moe(package, tp_size, tp_rank, tokens, forced_key=None) -> list[str]:
    """Run the routed entry (or its variant `forced_key`, called through the package's table) on the routed
    op's inputs, sanitized in a seeded order, and compare it bit for bit with the route package's launch
    followed by the moe entry. Returns the routed call's kernel names."""
    pkg = discovery.discover()[package]
    module = importlib.import_module(pkg.module)
    entries = pkg.import_entries()
    route = discovery.discover()[ROUTER].import_entries()["route"]
    raw = build_routed_moe_inputs(tokens, {**GPTOSS, "tp_size": tp_size, "tp_rank": tp_rank}, 11)
    dev = devices.current().torch_device
    inputs = checks.to_device(pkg.entry_inputs("routed", raw), dev)
    weights = {k: v for k, v in inputs.items() if k not in ("x", "router_weight", "router_bias")}

    def forced(x, router_weight, router_bias, **w):
        out = torch.empty_like(x)
        module.VARIANTS[forced_key](*module.PIPELINE.fused_launch_args(forced_key, x, router_weight, router_bias, w,
                                                                       out, x.device), None)
        return out

    routed = entries["routed"] if forced_key is None else forced
    (fused,), records = checks._run(routed, inputs, order_seed=checks.seed_of("routed", tokens), sample={})
    fused = fused.cpu()
    topk_weights, topk_ids = route(inputs["x"], inputs["router_weight"], inputs["router_bias"], GPTOSS["top_k"])
    staged = entries["moe"](inputs["x"], topk_weights, topk_ids, **weights).cpu()
    assert torch.isfinite(fused.float()).all() and fused.float().abs().sum() > 0
    assert torch.equal(checks.row_bytes(fused), checks.row_bytes(staged)), \
        f"{int((checks.row_bytes(fused) != checks.row_bytes(staged)).sum())} bytes differ"
    return [r.kernel_name for r in records]


@pytest.mark.parametrize("package,tp_size,tp_rank,tokens", CASES, ids=lambda v: str(v))
def test_routed_is_route_then_moe_bitwise(package, tp_size, tp_rank, tokens):
    names = _routed_against_route_then_moe(package, tp_size, tp_rank, tokens)
    routed_from = importlib.import_module(discovery.discover()[package].module).ROUTED_PREFILL_FROM
    if names and tokens < routed_from:  # decode: 3 launches
        assert len(names) == 3 and names[0].endswith("_route_quant_sort"), names
    elif names:  # a prefill tier: 4
        assert len(names) == 4 and "_route_quant_sort_prefill" in names[0], names


@pytest.mark.parametrize("package,tp_size,tp_rank,tokens,key", [
    (TP8, 8, 7, 17, "fused.prefill"),
    (TP8, 8, 7, 17, "fused.prefill128"),
    pytest.param(TP8, 8, 7, 40, "fused.prefill",
                 marks=pytest.mark.skipif(not FULL, reason="AMD_KERNELS_FULL=1 runs it")),
    pytest.param("moe/mxfp4_h2880_i2880_e128_top4", 1, 0, 17, "fused.prefill",
                 marks=pytest.mark.skipif(not FULL, reason="TP1: AMD_KERNELS_FULL=1 runs it")),
    pytest.param("moe/mxfp4_h2880_i2880_e128_top4", 1, 0, 17, "fused.prefill128",
                 marks=pytest.mark.skipif(not FULL, reason="TP1: AMD_KERNELS_FULL=1 runs it"))], ids=str)
def test_routed_prefill_tier_is_route_then_moe_bitwise(package, tp_size, tp_rank, tokens, key):
    """The routed entry's prefill tiers (fused.prefill and fused.prefill128: the router, quant and the
    super-tile sort in one launch, then the moe prefill tier's gate-up, down and combine), forced at a small
    count (the entry picks them from thousands of tokens, where a whole emulated run costs minutes): bitwise
    the route package's launch followed by the moe entry (the full tier at 17 tokens, the 64-row prefill tier
    at 40), in 4 launches."""
    from amd_kernels.moe.mxfp4_moe.geometry import prefill_suffix

    names = _routed_against_route_then_moe(package, tp_size, tp_rank, tokens, forced_key=key)
    if names:
        suffix = prefill_suffix(8 if key.endswith("128") else 4)
        assert len(names) == 4 and names[0].endswith("_route_quant_sort" + suffix), names
        assert names[1].endswith("_gate_up" + suffix) and names[2].endswith("_down" + suffix), names
