"""MoE weight preparation: the prepared (sharded, padded, preshuffled) weights hold exactly the
checkpoint's codes and scale bytes. TP8 follows vLLM's gpt-oss loader: whole 32-column scale blocks per rank
(384 columns, rank 7 the last 192), from the full checkpoint or from the slice vLLM's loader gives the rank,
and a checkpoint whose dims do not fit is refused with an error naming the tensor."""

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


DIMS = dict(hidden=H, intermediate=I, experts=E)


def _given(checkpoint, activation):
    biases = activation == "gptoss"  # the swiglu MoE has none
    return {k: (v if biases or not k.endswith("bias") else None) for k, v in checkpoint.items()}


def vllm_slice(checkpoint, rank, activation="gptoss", pad_to=None):
    """What vLLM's gpt-oss loader hands rank `rank` at TP8 (w13 rows [2 start, 2 end), w2 K-columns and
    scale blocks [start, end), the w2 bias whole), optionally zero-padded to `pad_to` columns."""
    start, end = 384 * rank, min(384 * (rank + 1), I)
    c = checkpoint
    if activation == "gptoss":
        rows = torch.arange(2 * start, 2 * end)
    else:
        rows = torch.cat((torch.arange(start, end), torch.arange(I + start, I + end)))
    out = dict(w13_blocks=c["w13_blocks"][:, rows], w13_scales=c["w13_scales"][:, rows],
               w13_bias=c["w13_bias"][:, rows], w2_blocks=c["w2_blocks"][:, :, start // 2:end // 2],
               w2_scales=c["w2_scales"][:, :, start // 32:end // 32], w2_bias=c["w2_bias"])
    if pad_to is not None and pad_to > end - start:
        extra = pad_to - (end - start)

        def pad(t, dim, n):
            shape = list(t.shape)
            shape[dim] = n
            return torch.cat((t, torch.zeros(shape, dtype=t.dtype)), dim=dim)
        def pad13(t):  # gptoss: interleaved rows, padding after; swiglu: each of gate and up padded
            if activation == "gptoss":
                return pad(t, 1, 2 * extra)
            return torch.cat([pad(h, 1, extra) for h in t.chunk(2, dim=1)], dim=1)
        out = dict(w13_blocks=pad13(out["w13_blocks"]), w13_scales=pad13(out["w13_scales"]),
                   w13_bias=pad13(out["w13_bias"]), w2_blocks=pad(out["w2_blocks"], 2, extra // 2),
                   w2_scales=pad(out["w2_scales"], 2, extra // 32), w2_bias=out["w2_bias"])
    return _given(out, activation)


@pytest.mark.parametrize("tp,rank", [(1, 0)] + [(8, r) for r in range(8)])
@pytest.mark.parametrize("activation", ["gptoss", "swiglu"])
def test_sharding_is_exact(checkpoint, tp, rank, activation):
    biases = activation == "gptoss"
    p = P.prepare_weights(**_given(checkpoint, activation), activation=activation, **DIMS, tp_size=tp, tp_rank=rank)
    assert {k: v.dtype for k, v in p.items()} == P.WEIGHT_DTYPES
    start, end = P.shard_span(I, tp, rank)
    assert (start, end) == ((0, I) if tp == 1 else (384 * rank, min(384 * rank + 384, I)))
    ip = P.padded_intermediate(I, tp)
    assert ip == (2944 if tp == 1 else 384)
    n = end - start
    w13 = R.mxfp4_dequantize(checkpoint["w13_blocks"], checkpoint["w13_scales"])
    w2 = R.mxfp4_dequantize(checkpoint["w2_blocks"], checkpoint["w2_scales"])
    c13, s13 = P.unshuffle_b(p["w13"], p["w13_scale"], H)
    c2, s2 = P.unshuffle_b(p["w2"], p["w2_scale"], ip)
    d13 = R.mxfp4_dequantize(c13, s13).reshape(E, ip // 32, 2, 32, H)
    gate, up = d13[:, :, 0].reshape(E, ip, H), d13[:, :, 1].reshape(E, ip, H)
    cols = torch.arange(start, end)
    gr, ur = (2 * cols, 2 * cols + 1) if activation == "gptoss" else (cols, cols + I)
    assert torch.equal(gate[:, :n], w13[:, gr]) and torch.equal(up[:, :n], w13[:, ur])
    assert not c13.reshape(E, ip // 32, 2, 32, H // 2)[:, n // 32:].any()  # padding: zero codes ...
    assert not s13.reshape(E, ip // 32, 2, 32, H // 32)[:, n // 32:].any()  # ... and zero scale bytes
    d2 = R.mxfp4_dequantize(c2, s2)
    assert torch.equal(d2[:, :, :n], w2[:, :, start:end]) and not c2[:, :, n // 2:].any()
    # Scale bytes are copied, not recomputed: each prepared w2 block carries its checkpoint block's byte.
    assert torch.equal(s2[:, :, : n // 32], checkpoint["w2_scales"][:, :, start // 32: end // 32])
    assert not s2[:, :, n // 32:].any()
    bias13 = p["w13_bias"].reshape(E, ip // 32, 2, 32)[:, :, 0].reshape(E, ip)
    assert torch.equal(bias13[:, :n], checkpoint["w13_bias"][:, gr].float() if biases else torch.zeros(E, n))
    assert not bias13[:, n:].any()
    added = biases and rank == 0
    assert torch.equal(p["w2_bias"], checkpoint["w2_bias"].float() if added else torch.zeros(E, H))
    # The kernels skip loads of padded columns and of a w2 bias not added, by `shard`.
    assert p["shard"].tolist() == [0, n, int(added), 0]


@pytest.mark.parametrize("rank", [0, 3, 7])
@pytest.mark.parametrize("activation", ["gptoss", "swiglu"])
def test_vllm_rank_slice_prepares_like_the_full_checkpoint(checkpoint, rank, activation):
    full = P.prepare_weights(**_given(checkpoint, activation), activation=activation, **DIMS, tp_size=8,
                             tp_rank=rank)
    for pad_to in (None, 384):  # as the loader narrows it, and as vLLM's padded parameter holds it
        part = P.prepare_weights(**vllm_slice(checkpoint, rank, activation, pad_to), activation=activation, **DIMS,
                                 tp_size=8, tp_rank=rank)
        assert full.keys() == part.keys() and all(torch.equal(full[k], part[k]) for k in full)


def test_a_checkpoint_of_other_dims_names_the_tensor_and_the_shapes(checkpoint):
    # The old per-rank cut (360 columns, straddling scale blocks) is not vLLM's: refused, not mis-prepared.
    old = {**checkpoint, **{k: checkpoint[k][:, 720:1440] for k in ("w13_blocks", "w13_scales", "w13_bias")}}
    with pytest.raises(ValueError, match=r"^w13_blocks: shape \[2, 720, 1440\] is not a checkpoint of this MoE "
                                         r"\(hidden 2880, intermediate 2880 over tp_size 8"
                                         r".*\[2, 768, 1440\] \(rank 1's slice"):
        P.prepare_weights(**old, activation="gptoss", **DIMS, tp_size=8, tp_rank=1)
    # A slice for another rank (rank 7's 192 columns handed to rank 1) and mixed forms name the tensor.
    with pytest.raises(ValueError, match=r"^w13_blocks: shape \[2, 384, 1440\]"):
        P.prepare_weights(**vllm_slice(checkpoint, 7), activation="gptoss", **DIMS, tp_size=8, tp_rank=1)
    mixed = dict(vllm_slice(checkpoint, 1), w2_blocks=checkpoint["w2_blocks"])
    with pytest.raises(ValueError, match=r"^w2_blocks: .* is the full checkpoint, but w13_blocks is rank 1's slice"):
        P.prepare_weights(**mixed, activation="gptoss", **DIMS, tp_size=8, tp_rank=1)
    # Another hidden size (a different model's checkpoint) and a wrong dtype.
    with pytest.raises(ValueError, match=r"^w13_blocks: .*hidden 6144"):
        P.prepare_weights(**checkpoint, activation="gptoss", hidden=6144, intermediate=I, experts=E)
    with pytest.raises(TypeError, match=r"^w2_scales: expected dtype torch.uint8"):
        P.prepare_weights(**dict(checkpoint, w2_scales=checkpoint["w2_scales"].float()), activation="gptoss", **DIMS)
    with pytest.raises(ValueError, match=r"^tp_rank: rank 8 of 8|^tp_size/tp_rank"):
        P.prepare_weights(**checkpoint, activation="gptoss", **DIMS, tp_size=8, tp_rank=8)


def test_swiglu_biases_are_refused(checkpoint):
    with pytest.raises(ValueError, match="w13_bias / w2_bias"):
        P.prepare_weights(**checkpoint, activation="swiglu", **DIMS)


def test_shard_spans_are_vllms():
    spans = [P.shard_span(2880, 8, r) for r in range(8)]
    assert spans == [(384 * r, 384 * (r + 1)) for r in range(7)] + [(2688, 2880)]
    assert P.padded_intermediate(2880, 8) == 384
    assert all(R.shard_columns(2880, 8, r) == spans[r] for r in range(8))
