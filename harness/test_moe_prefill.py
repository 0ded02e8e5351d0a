"""The MoE prefill tier (kernels/moe/mxfp4_moe/prefill.py) on a small shape built for it: its output must be
bitwise the 16-row tier's on the same inputs. The routing puts half the tokens' first slot on expert 0 (100
pairs, seven 16-row tiles: super-tiles of 4 and 3), the rest spread, one id out of
range (dropped); the gate-up K has a tail (hidden 2880 in 23 K-steps), the intermediate has dead columns (a
TP rank's padding), and the K grouping is the TP8 package's (chunks of 4 K-steps, pairs of chunks). The
regime shapes' edge is checked by test_batch_invariance (255 | 256 tokens)."""

from __future__ import annotations

import pytest
import torch

from harness import device as devices

H, IP, E, TOP_K, LIVE, M = 2880, 384, 8, 4, 192, 200


@pytest.fixture(scope="module")
def pipeline():
    from amd_kernels import warm_up
    from amd_kernels.moe import mxfp4_moe

    p = mxfp4_moe.build(H, IP, E, TOP_K, "gptoss", "test_moe_prefill", small_m_waves=8, prefill_from=256)
    return p, warm_up.VariantTable("harness.test_moe_prefill", {k: warm_up.Variant(*v) for k, v in p.variants.items()})


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
    w["shard"] = torch.tensor([0, LIVE, 1, 0], dtype=torch.int32)
    ids = torch.stack([torch.randperm(E, generator=g)[:TOP_K] for _ in range(M)]).to(torch.int32)
    for i in range(M // 2):  # expert 0 hot: 100 pairs
        ids[i] = torch.cat([torch.zeros(1, dtype=torch.int32), 1 + torch.randperm(E - 1, generator=g)[:TOP_K - 1]])
    ids[3, TOP_K - 1] = E + 5
    x = torch.randn(M, H, generator=g).to(torch.bfloat16)
    tw = torch.rand(M, TOP_K, generator=g)
    return {k: v.to(dev) for k, v in w.items()}, x.to(dev), tw.to(dev), ids.to(dev)


def test_prefill_bitwise_equal_to_the_16_row_tier(pipeline):
    p, table = pipeline
    assert p.variant_for(256) == "moe.prefill" and p.variant_for(255) != "moe.prefill"
    dev = devices.current().torch_device
    w, x, tw, ids = _inputs(p, dev)
    outs = {}
    for key in ("moe.full", "moe.prefill"):
        out = torch.zeros_like(x)
        table[key](*p.launch_args(key, x, tw, ids, w, out, dev), None)
        outs[key] = out.cpu()
    full, pre = (outs[k].view(torch.int16) for k in ("moe.full", "moe.prefill"))
    assert (outs["moe.full"] != 0).any(dim=1).all(), "a row of the 16-row tier's output is all zero"
    differ = (full != pre).any(dim=1)
    assert not differ.any(), f"rows {differ.nonzero().flatten().tolist()[:10]} differ between the tiers"
