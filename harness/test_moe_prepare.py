"""MoE weight preparation: the prepared (sharded, padded, preshuffled) weights hold exactly the
checkpoint's codes and scale bytes: at TP8 the 32-element scale blocks that straddle shard edges are
split by zeroing the other rank's codes, never by requantizing."""

from __future__ import annotations

import pytest
import torch

from harness import importer

importer.expose_amd_kernels()

from amd_kernels.moe import prepare as P  # noqa: E402
from references import moe as R  # noqa: E402

E, H, I = 2, 2880, 2880


@pytest.fixture(scope="module")
def checkpoint():
    g = torch.Generator().manual_seed(0)
    return dict(
        w13_blocks=torch.randint(0, 256, (E, 2 * I, H // 2), dtype=torch.uint8, generator=g),
        w13_scales=torch.randint(100, 140, (E, 2 * I, H // 32), dtype=torch.uint8, generator=g),
        w13_bias=torch.randn(E, 2 * I, generator=g).bfloat16(),
        w2_blocks=torch.randint(0, 256, (E, H, I // 2), dtype=torch.uint8, generator=g),
        w2_scales=torch.randint(100, 140, (E, H, I // 32), dtype=torch.uint8, generator=g),
        w2_bias=torch.randn(E, H, generator=g).bfloat16(),
    )


@pytest.mark.parametrize("tp,rank", [(1, 0)] + [(8, r) for r in range(8)])
@pytest.mark.parametrize("activation", ["gptoss", "swiglu"])
def test_sharding_is_exact(checkpoint, tp, rank, activation):
    biases = activation == "gptoss"  # the swiglu MoE has none
    given = {k: (v if biases or not k.endswith("bias") else None) for k, v in checkpoint.items()}
    p = P.prepare_weights(**given, activation=activation, tp_size=tp, tp_rank=rank)
    assert {k: v.dtype for k, v in p.items()} == P.WEIGHT_DTYPES
    start, end, lo, hi = P.shard_span(I, tp, rank)
    ip = P.padded_intermediate(I, tp)
    assert ip == (2944 if tp == 1 else 384)
    w13 = R.mxfp4_dequantize(checkpoint["w13_blocks"], checkpoint["w13_scales"])
    w2 = R.mxfp4_dequantize(checkpoint["w2_blocks"], checkpoint["w2_scales"])
    c13, s13 = P.unshuffle_b(p["w13"], p["w13_scale"], H)
    planes = P.w2_planes(I, tp)
    assert planes == (tp == 8)  # only TP8's rank columns straddle scale blocks
    c2, s2 = P.unshuffle_w2(p["w2"], p["w2_scale"], ip, planes)
    d13 = R.mxfp4_dequantize(c13, s13).reshape(E, ip // 32, 2, 32, H)
    gate, up = d13[:, :, 0].reshape(E, ip, H), d13[:, :, 1].reshape(E, ip, H)
    cols = torch.arange(lo, lo + ip)
    live = (cols >= start) & (cols < end)
    gr, ur = (2 * cols[live], 2 * cols[live] + 1) if activation == "gptoss" else (cols[live], cols[live] + I)
    assert torch.equal(gate[:, live], w13[:, gr]) and torch.equal(up[:, live], w13[:, ur])
    assert not gate[:, ~live].any() and not up[:, ~live].any()
    d2 = R.mxfp4_dequantize(c2, s2)
    assert torch.equal(d2[:, :, live], w2[:, :, cols[live]]) and not d2[:, :, ~live].any()
    # Scale bytes are copied, not recomputed: each prepared w2 block carries its checkpoint block's byte.
    nblk = min(hi, I) // 32 - lo // 32
    assert torch.equal(s2[:, :, :nblk], checkpoint["w2_scales"][:, :, lo // 32: lo // 32 + nblk])
    bias13 = p["w13_bias"].reshape(E, ip // 32, 2, 32)[:, :, 0].reshape(E, ip)
    assert torch.equal(bias13[:, live], checkpoint["w13_bias"][:, gr].float() if biases else torch.zeros(E, live.sum()))
    added = biases and rank == 0
    assert torch.equal(p["w2_bias"], checkpoint["w2_bias"].float() if added else torch.zeros(E, H))
    # The kernels skip loads of dead columns and of a w2 bias not added, by `shard`: it must name exactly
    # the live prepared columns (the weights are zero everywhere else) and the rank that adds the bias.
    assert p["shard"].tolist() == [int(live.nonzero().min()), int(live.nonzero().max()) + 1, int(added), 0]


@pytest.mark.parametrize("rank", range(8))
def test_tp8_w2_skipped_dwords_are_zero(checkpoint, rank):
    """The down kernel loads a w2 dword plane (8 codes of 16 rows) only if one of its codes is live; every
    plane it skips must hold zero codes, and every code it loads must be in a live plane."""
    p = P.prepare_weights(**checkpoint, activation="gptoss", tp_size=8, tp_rank=rank)
    live_lo, live_hi = p["shard"].tolist()[:2]
    e, ng, ks = p["w2"].shape[:3]
    planes = p["w2"].reshape(e, ng, ks, 4, 4, 64)  # [.., q, d, 16 lanes x 4 bytes]
    k0 = (torch.arange(ks).view(ks, 1, 1) * 128 + torch.arange(4).view(1, 4, 1) * 32
          + torch.arange(4).view(1, 1, 4) * 8)  # first code of plane (ks, q, d)
    loaded = (k0 + 8 > live_lo) & (k0 < live_hi)
    assert not planes[:, :, ~loaded].any()
    assert int(loaded.sum()) * 8 == live_hi - live_lo == 360  # exactly the live codes: no partial plane


def test_swiglu_biases_are_refused(checkpoint):
    with pytest.raises(ValueError, match="w13_bias / w2_bias"):
        P.prepare_weights(**checkpoint, activation="swiglu")


def test_shard_spans_fit_384():
    spans = [P.shard_span(2880, 8, r) for r in range(8)]
    assert [s[:2] for s in spans] == [(360 * r, 360 * (r + 1)) for r in range(8)]
    assert max(hi - lo for _, _, lo, hi in spans) == 384
    assert R.shard_columns(2880, 8, 1) == P.shard_span(2880, 8, 1)
