"""A deliberately wrong MFMA kernel must fail the emulator's check against torch.

A small FlyDSL GEMM (one 32x32 tile, K=32, four waves, v_mfma_f32_16x16x32_bf16 through FlyDSL's tiled-MMA
API): the correct variant must match torch (cosine > 0.9999); the broken variant reads operand B through a view
whose K index has bits 3 and 4 swapped (the 8-element K groups of lanes 16-31 and 32-47 trade places - the kind
of slip a hand-written preshuffle or LDS swizzle makes) and must not.
"""

from __future__ import annotations

import pytest
import torch

from harness import emulator

emulator.install()

import flydsl.compiler as flyc  # noqa: E402  (after install)
import flydsl.expr as fx  # noqa: E402

BM, BN, BK = 32, 32, 32


def _make_gemm(broken: bool):
    @flyc.kernel
    def mfma_tile_kernel(A: fx.Tensor, B: fx.Tensor, C: fx.Tensor):
        tid = fx.thread_idx.x
        A = fx.rocdl.make_buffer_tensor(A)
        if broken:
            B = fx.Tensor(fx.make_view(B.iter, fx.make_layout((BN, (8, 2, 2)), (BK, (1, 16, 8)))))
        B = fx.rocdl.make_buffer_tensor(B)
        C = fx.rocdl.make_buffer_tensor(C)
        A = fx.slice(fx.zipped_divide(A, (BM, BK)), (None, 0))
        B = fx.slice(fx.zipped_divide(B, (BN, BK)), (None, 0))
        C = fx.slice(fx.zipped_divide(C, (BM, BN)), (None, 0))
        mma_atom = fx.make_mma_atom(fx.rocdl.MFMA(16, 16, 32, fx.BFloat16))
        tiled_mma = fx.make_tiled_mma(mma_atom, fx.make_layout((2, 2, 1), (1, 2, 0)))
        thr_mma = tiled_mma.thr_slice(tid)
        load = fx.make_copy_atom(fx.rocdl.BufferCopy128b(), fx.BFloat16)
        store = fx.make_copy_atom(fx.rocdl.BufferCopy32b(), fx.Float32)
        cpA, cpB = fx.make_tiled_copy_A(load, tiled_mma), fx.make_tiled_copy_B(load, tiled_mma)
        cpC = fx.make_tiled_copy_C(store, tiled_mma)
        sA, sB, sC = cpA.get_slice(tid), cpB.get_slice(tid), cpC.get_slice(tid)
        fA, fB, fC = thr_mma.make_fragment_A(A), thr_mma.make_fragment_B(B), thr_mma.make_fragment_C(C)
        fx.copy(load, sA.partition_S(A), sA.retile(fA), pred=None)
        fx.copy(load, sB.partition_S(B), sB.retile(fB), pred=None)
        fC.fill(0)
        fx.gemm(mma_atom, fC, fA, fB, fC)
        fx.copy(store, sC.retile(fC), sC.partition_S(C), pred=None)

    @flyc.jit
    def mfma_tile(A: fx.Tensor, B: fx.Tensor, C: fx.Tensor, stream: fx.Stream = fx.Stream(None)):
        mfma_tile_kernel(A, B, C).launch(grid=(1, 1, 1), block=(256, 1, 1), stream=stream)

    return mfma_tile


def _run(broken: bool):
    g = torch.Generator().manual_seed(11)
    A = torch.randn(BM, BK, generator=g).bfloat16()
    B = torch.randn(BN, BK, generator=g).bfloat16()
    C = torch.zeros(BM, BN)
    with emulator.launches() as recs:
        _make_gemm(broken)(A, B, C)
    assert len(recs) == 1 and recs[0].counters["mfma"]["v_mfma_f32_16x16x32_bf16"] == 4
    ref = A.float() @ B.float().T
    return torch.nn.functional.cosine_similarity(C.flatten(), ref.flatten(), dim=0).item()


@pytest.mark.parametrize("broken", [False, True], ids=["correct", "permuted_k_in_b"])
def test_mfma_gemm_kernel_is_checked(broken):
    cos = _run(broken)
    if broken:
        assert cos < 0.9, f"a kernel with a permuted K order in B passed (cos {cos})"
    else:
        assert cos > 0.9999
