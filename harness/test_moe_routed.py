"""The routed MoE entry (router weights + hidden states) against the path it replaces, bit for bit: the route
package's `route`, then the MoE package's `moe` (route launch + four MoE launches), against `routed` (at decode
sizes three launches: the router split over experts with the activation quantization and the sort, by
tickets, in the first; gate-up; down with the combine folded in: mxfp4_moe/fused.py). The routed call runs
under the sanitizer and the memory guard, in a seeded workgroup order (the tickets pick other last
workgroups). Token counts: 1; the TP8 gate-up tier edge (small_m | full at 5 | 6: CI runs 6, AMD_KERNELS_FULL=1
also 5; test_kernels' routed cases at 4 tokens run small_m); a router tile edge (17 = 16 + 1: two tiles, the
second holding one real row). Heavy (emulated MoE calls): run this file alone,
without -n."""

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
         # the prefill tier (no fused form: the routed entry runs its launches as `moe` does), emulated whole
         pytest.param(TP8, 8, 7, 256,
                      marks=pytest.mark.skipif(not FULL, reason="256 tokens whole: AMD_KERNELS_FULL=1 runs it"))]


@pytest.mark.parametrize("package,tp_size,tp_rank,tokens", CASES, ids=lambda v: str(v))
def test_routed_is_route_then_moe_bitwise(package, tp_size, tp_rank, tokens):
    pkg = discovery.discover()[package]
    entries = pkg.import_entries()
    route = discovery.discover()[ROUTER].import_entries()["route"]
    raw = build_routed_moe_inputs(tokens, {**GPTOSS, "tp_size": tp_size, "tp_rank": tp_rank}, 11)
    dev = devices.current().torch_device
    inputs = checks.to_device(pkg.entry_inputs("routed", raw), dev)
    weights = {k: v for k, v in inputs.items() if k not in ("x", "router_weight", "router_bias")}
    (fused,), records = checks._run(entries["routed"], inputs, order_seed=checks.seed_of("routed", tokens), sample={})
    fused = fused.cpu()
    topk_weights, topk_ids = route(inputs["x"], inputs["router_weight"], inputs["router_bias"], GPTOSS["top_k"])
    staged = entries["moe"](inputs["x"], topk_weights, topk_ids, **weights).cpu()
    assert torch.isfinite(fused.float()).all() and fused.float().abs().sum() > 0
    assert torch.equal(checks.row_bytes(fused), checks.row_bytes(staged)), \
        f"{int((checks.row_bytes(fused) != checks.row_bytes(staged)).sum())} bytes differ"
    if records and tokens < importlib.import_module(pkg.module).PIPELINE.prefill_from:  # decode sizes
        names = [r.kernel_name for r in records]
        assert len(names) == 3 and names[0].endswith("_route_quant_sort"), names
