"""The MXFP8 attention projections chained as a model runs them, against the chained references.

QKV: x -> rmsnorm_mxfp8 (norm/rmsnorm_h2880) -> mxfp8_gemm (gemm/mxfp8_n*_k2880): the GEMM consumes the
norm kernel's q and scales as they are (row-major [M, 2880], [M, 90]).
O:   attention output bf16 -> mxfp8_quant (quant/mxfp8_k*) -> mxfp8_gemm (gemm/mxfp8_n2880_k*).
Each is compared with reference(reference(...)); also the weight packing's inverse and the K tail (a decode
tier and the whole grid of the prefill tier).
"""

from __future__ import annotations

import importlib

import pytest
import torch

from harness import checks
from harness import device as devices
from references import OPS, cosine
from references.gemm import build_gemm_inputs, mxfp8_gemm, mxfp8_quant
from references.norm import build_inputs as norm_inputs, rmsnorm_mxfp8

CHAIN_COSINE = 0.9999  # two quantizations deep: an element may move by one E4M3 step in the first


def _mod(path: str):
    return importlib.import_module("amd_kernels." + path.replace("/", "."))


def _dev(t):
    return t.to(devices.current().torch_device)


@pytest.mark.parametrize("n", [640, 5120])
@pytest.mark.parametrize("tokens", [1, 8, 64])
def test_rmsnorm_quant_then_qkv(n, tokens):
    k = 2880
    norm = _mod("norm/rmsnorm_h2880").rmsnorm_mxfp8
    gemm_pkg = _mod(f"gemm/mxfp8_n{n}_k{k}")
    ni = norm_inputs(tokens, {"hidden": k, "eps": 1e-5}, checks.seed_of("chain", n, tokens), with_residual=False)
    gi = build_gemm_inputs(tokens, {"n": n, "k": k}, checks.seed_of("chain-w", n))
    w_packed, w_scales_packed = gemm_pkg.prepare_weights(gi["w"], gi["w_scales"])
    q, s = norm(_dev(ni["x"]), _dev(ni["weight"]), ni["eps"])
    y = gemm_pkg.mxfp8_gemm(q, s, _dev(w_packed), _dev(w_scales_packed), _dev(gi["bias"]))
    rq, rs = rmsnorm_mxfp8(**ni)
    (ry,) = mxfp8_gemm(rq, rs, gi["w"], gi["w_scales"], gi["bias"])
    assert cosine(y.cpu().float(), ry.float()) >= CHAIN_COSINE


@pytest.mark.parametrize("k", [512, 4096])
@pytest.mark.parametrize("tokens", [1, 8, 64])
def test_quant_then_o_proj(k, tokens):
    n = 2880
    quant = _mod(f"quant/mxfp8_k{k}").mxfp8_quant
    gemm_pkg = _mod(f"gemm/mxfp8_n{n}_k{k}")
    x = OPS["mxfp8_quant"].build_inputs(tokens, {"k": k}, checks.seed_of("chain-o", k, tokens))["x"]
    gi = build_gemm_inputs(tokens, {"n": n, "k": k}, checks.seed_of("chain-ow", k))
    w_packed, w_scales_packed = gemm_pkg.prepare_weights(gi["w"], gi["w_scales"])
    q, s = quant(_dev(x))
    y = gemm_pkg.mxfp8_gemm(q, s, _dev(w_packed), _dev(w_scales_packed), _dev(gi["bias"]))
    rq, rs = mxfp8_quant(x)
    (ry,) = mxfp8_gemm(rq, rs, gi["w"], gi["w_scales"], gi["bias"])
    assert cosine(y.cpu().float(), ry.float()) >= CHAIN_COSINE


def test_packed_layout_is_a_permutation_of_the_checkpoint():
    """w_packed[b, u, 256g + 16r + j] = w[16b + r, 64u + 16g + j]; scale byte l of step s = w_scales[.., 4s + g]."""
    from amd_kernels.gemm.mxfp8_gemm import prepare_weights

    gi = build_gemm_inputs(1, {"n": 32, "k": 2880}, 3)
    wp, sp = prepare_weights(gi["w"], gi["w_scales"])
    w, ws = gi["w"].view(torch.uint8), gi["w_scales"]
    wpb = wp.view(torch.uint8)
    for b, u, g, r, j in [(0, 0, 0, 0, 0), (1, 44, 3, 15, 15), (0, 7, 2, 9, 4), (1, 22, 1, 3, 11)]:
        assert wpb[b, u, 256 * g + 16 * r + j] == w[16 * b + r, 64 * u + 16 * g + j]
    for b, s, g, r in [(0, 0, 0, 0), (1, 22, 1, 15), (0, 11, 3, 7)]:
        assert sp[b, s, 16 * g + r] == ws[16 * b + r, 4 * s + g]
    assert int(sp[:, 22, 32:].max()) == 0  # K blocks 90, 91 do not exist: zero data, scale byte 0


@pytest.mark.parametrize("tokens", [2, 600])  # a decode tier; the prefill tier (LDS-sharing), every tile run
def test_k_tail_does_not_read_the_next_row(tokens):
    """Odd rows (each even row's neighbour) full of NaN codes and scale 255 must not reach the even rows."""
    k, n = 2880, 640
    gemm_pkg = _mod(f"gemm/mxfp8_n{n}_k{k}")
    gi = build_gemm_inputs(tokens, {"n": n, "k": k}, 11)
    gi["x"].view(torch.uint8)[1::2] = 0x7F  # E4M3 NaN
    gi["x_scales"][1::2] = 255  # E8M0 NaN
    w_packed, w_scales_packed = gemm_pkg.prepare_weights(gi["w"], gi["w_scales"])
    y = gemm_pkg.mxfp8_gemm(_dev(gi["x"]), _dev(gi["x_scales"]), _dev(w_packed), _dev(w_scales_packed),
                            _dev(gi["bias"]))
    (ry,) = mxfp8_gemm(gi["x"][0::2], gi["x_scales"][0::2], gi["w"], gi["w_scales"], gi["bias"])
    assert torch.isfinite(y[0::2].cpu().float()).all()
    assert cosine(y[0::2].cpu().float(), ry.float()) >= 0.99999
