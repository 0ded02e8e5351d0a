"""End to end: small FlyDSL kernels written here run on CPU torch tensors through install() and match torch."""

from __future__ import annotations

import pytest
import torch

from harness import emulator

emulator.install()

import flydsl.compiler as flyc  # noqa: E402  (after install: FlyDSL's runtime must bind to the shim)
import flydsl.expr as fx  # noqa: E402


@flyc.kernel
def _vadd_kernel(A: fx.Tensor, B: fx.Tensor, C: fx.Tensor, tiled_copy: fx.TiledCopy):
    tid = fx.thread_idx.x
    bid_x, bid_y = fx.block_idx.x, fx.block_idx.y
    M, N = A.shape.unpack()
    idC = fx.make_view((0, 0), fx.make_identity_layout((M, N)))
    TileMN = tiled_copy.tile_mn
    gA = fx.flat_divide(A, TileMN)[None, None, bid_x, bid_y]
    gB = fx.flat_divide(B, TileMN)[None, None, bid_x, bid_y]
    gC = fx.flat_divide(C, TileMN)[None, None, bid_x, bid_y]
    cC = fx.flat_divide(idC, TileMN)[None, None, bid_x, bid_y]
    thr = tiled_copy.get_slice(tid)
    tA, tB, tC = thr.partition_S(gA), thr.partition_S(gB), thr.partition_D(gC)
    tP = thr.partition_S(cC)[(0, None), None, None]
    rA, rB, rC = fx.make_fragment_like(tA), fx.make_fragment_like(tB), fx.make_fragment_like(tC)
    pred = fx.make_fragment_like(tP, dtype=fx.Boolean)
    for a in fx.range_constexpr(fx.size(pred.shape).unpack()):
        pred[a] = fx.elem_less(tP[a], (M, N))
    atom = fx.make_copy_atom(fx.UniversalCopy128b(), fx.Float32)
    fx.copy(atom, tA, rA, pred=pred)
    fx.copy(atom, tB, rB, pred=pred)
    rC.store(rA.load() + rB.load())
    fx.copy(atom, rC, tC, pred=pred)


@flyc.jit
def _vadd(A: fx.Tensor, B: fx.Tensor, C: fx.Tensor, stream: fx.Stream = fx.Stream(None)):
    atom = fx.make_copy_atom(fx.UniversalCopy128b(), fx.Float32)
    tiled = fx.make_tiled_copy_tv(atom, fx.make_ordered_layout((8, 16), order=(1, 0)),
                                  fx.make_ordered_layout((1, 4), order=(0, 1)))
    tm, tn = tiled.tile_mn.unpack()
    M, N = A.shape.unpack()
    _vadd_kernel(A, B, C, tiled).launch(grid=((M + tm - 1) // tm, (N + tn - 1) // tn, 1), block=(128, 1, 1),
                                        stream=stream)


def _inputs(M, N):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(M, N, generator=g), torch.randn(M, N, generator=g), torch.zeros(M, N))


def test_vector_add_with_predicated_border_tiles():
    A, B, C = _inputs(37, 204)  # N % 4 == 0: the example predicates whole float4s
    with emulator.launches() as recs:
        _vadd(A, B, C)
    assert torch.equal(C, A + B)
    (rec,) = recs
    c = rec.counters
    assert c["workgroups"] == rec.grid[0] * rec.grid[1] and c["waves"] == 2 * c["workgroups"]
    assert c["global_store_distinct_bytes"] == 37 * 204 * 4
    assert c["global_load_distinct_bytes"] == 2 * 37 * 204 * 4


def test_workgroup_sample_runs_only_reported_tiles():
    A, B, C = _inputs(64, 256)
    with emulator.launches() as recs, emulator.options(workgroup_sample=3, sample_seed=5):
        _vadd(A, B, C)
    (rec,) = recs
    assert rec.sampled and len(rec.workgroups_executed) == 3
    done = torch.zeros_like(C, dtype=torch.bool)
    for x, y, _ in rec.workgroups_executed:
        done[8 * x: 8 * x + 8, 64 * y: 64 * y + 64] = True
    assert torch.equal(C[done], (A + B)[done])
    assert not C[~done].any()


def test_workgroup_sample_also_runs_the_named_workgroups():
    A, B, C = _inputs(64, 256)
    with emulator.launches() as recs, emulator.options(workgroup_sample=3, sample_seed=5):
        _vadd(A, B, C)
    sampled = set(recs[0].workgroups_executed)
    grid = recs[0].grid
    extra = next((x, y, 0) for x in range(grid[0]) for y in range(grid[1]) if (x, y, 0) not in sampled)
    with emulator.launches() as recs, emulator.options(workgroup_sample=3, sample_seed=5,
                                                       workgroup_also=[extra, (grid[0], 0, 0)]):  # one off the grid
        _vadd(A, B, C)
    assert set(recs[0].workgroups_executed) == sampled | {extra}


def test_seeded_workgroup_order_gives_same_result():
    A, B, C = _inputs(40, 300)
    with emulator.options(workgroup_order_seed=123):
        _vadd(A, B, C)
    assert torch.equal(C, A + B)


@pytest.mark.parametrize("N", [2880, 6144])
def test_rmsnorm_style_reduction_kernel_from_flydsl(N):
    """FlyDSL's own RMSNorm (wave shuffles, LDS block reduction, barriers) when its sources are around."""
    import importlib.util
    import sys
    from pathlib import Path

    root = Path("/tmp/fly")
    if not (root / "kernels" / "norm" / "rmsnorm_kernel.py").is_file():
        pytest.skip("FlyDSL source checkout not present (/tmp/fly)")
    sys.path.insert(0, str(root))
    try:
        spec = importlib.util.spec_from_file_location("fly_rmsnorm", root / "kernels/norm/rmsnorm_kernel.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(root))
    fn = mod.build_rmsnorm_module(N, "bf16")
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, N, generator=g).bfloat16()
    w = torch.randn(N, generator=g).bfloat16()
    out = torch.empty_like(x)
    fn(x, w, out, 5)
    xf = x.float()
    ref = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5) * w.float()
    assert torch.allclose(out.float(), ref, rtol=1e-2, atol=1e-2)
