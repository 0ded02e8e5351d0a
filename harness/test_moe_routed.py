"""The routed MoE entry (router weights + hidden states) against the path it replaces, bit for bit: the route
package's `route`, then the MoE package's `moe` (route launch + four MoE launches), against `routed` (route
launch + three: the combine folded into down, mxfp4_moe/fused.py). Token counts on both sides of the TP8
gate-up tier edge (small_m | full at 5 | 6). Heavy (emulated MoE calls): run this file alone, without -n."""

from __future__ import annotations

import os
import pytest
import torch

from harness import checks, discovery
from harness import device as devices
from references.moe import build_routed_moe_inputs

GPTOSS = {"hidden": 2880, "intermediate": 2880, "experts": 128, "top_k": 4}
ROUTER = "moe/route_h2880_e128_top4"
FULL = os.environ.get("AMD_KERNELS_FULL", "") not in ("", "0")
# CI runs the TP8 cases (both gate-up tiers); the TP1 case (the same fused launches at another geometry, its
# routed op checked against the reference in test_kernels at 4 tokens) costs ~2 CPU-minutes: FULL only.
CASES = [("moe/mxfp4_h2880_i384_e128_top4", 8, 7, 3), ("moe/mxfp4_h2880_i384_e128_top4", 8, 7, 6),
         pytest.param("moe/mxfp4_h2880_i2880_e128_top4", 1, 0, 2,
                      marks=pytest.mark.skipif(not FULL, reason="TP1: AMD_KERNELS_FULL=1 runs it")),
         # the prefill tier (no fused form: the routed entry runs its launches as `moe` does), emulated whole
         pytest.param("moe/mxfp4_h2880_i384_e128_top4", 8, 7, 256,
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
    fused = entries["routed"](**inputs).cpu()
    topk_weights, topk_ids = route(inputs["x"], inputs["router_weight"], inputs["router_bias"], GPTOSS["top_k"])
    staged = entries["moe"](inputs["x"], topk_weights, topk_ids, **weights).cpu()
    assert torch.isfinite(fused.float()).all() and fused.float().abs().sum() > 0
    assert torch.equal(checks.row_bytes(fused), checks.row_bytes(staged)), \
        f"{int((checks.row_bytes(fused) != checks.row_bytes(staged)).sum())} bytes differ"
