"""Host-side errors that must say what is wrong: another package's weights, a bad environment variable,
and a row slice of a tensor the kernel reads bytewise (accepted)."""

from __future__ import annotations

import contextlib
import itertools

import pytest
import torch

from amd_kernels import warm_up
from harness import cases, checks, discovery
from harness import device as devices
from references import OPS

PACKAGES = discovery.discover()
GEMMS = {s.kernel: s for s in cases.op_shapes() if s.kernel.startswith("gemm/")}


def _gemm_inputs(shape, tokens: int, seed: int) -> dict:
    pkg = PACKAGES[shape.kernel]
    raw = OPS[shape.op].build_inputs(tokens, shape.dims, seed)
    return checks.to_device(pkg.entry_inputs(pkg.entry_for_op(shape.op), raw), devices.current().torch_device)


def _gemm_entry(shape):
    pkg = PACKAGES[shape.kernel]
    return pkg.import_entries()[pkg.entry_for_op(shape.op)]


PAIRS = [(a, b) for a, b in itertools.permutations(GEMMS, 2)
         if (GEMMS[a].dims.get("k") == GEMMS[b].dims.get("k")) or (GEMMS[a].dims.get("n") == GEMMS[b].dims.get("n"))]


@pytest.mark.parametrize("served,other", PAIRS, ids=lambda p: p.split("/")[-1])
def test_weights_packed_for_another_shape_name_that_shape(served, other):
    """Prepared weights of one GEMM package passed to another (e.g. n5120 to n640): the error says which
    shape they were packed for and which this package serves, not "pass it through prepare_weights()"."""
    mine, theirs = _gemm_inputs(GEMMS[served], 2, 4), _gemm_inputs(GEMMS[other], 2, 4)
    broken = {**mine, "w_packed": theirs["w_packed"], "w_scales_packed": theirs["w_scales_packed"]}
    with pytest.raises(ValueError) as err:
        _gemm_entry(GEMMS[served])(**broken)
    message = str(err.value)
    assert message.startswith("w_packed: "), message
    assert "packed by prepare_weights() for a weight of" in message and "pass it through" not in message, message
    assert served.split("/")[-1] in message, message


def test_a_row_slice_of_x_scales_is_accepted_and_read_correctly():
    """x_scales rows are K/32 bytes (90 at K = 2880), so a row slice starts off any 16-byte boundary; the
    kernel reads it one byte at a time, so the entry takes it and gives the bytes of a contiguous copy."""
    shape = GEMMS["gemm/mxfp8_n640_k2880"]
    entry = _gemm_entry(shape)
    inputs = _gemm_inputs(shape, 3, 5)
    sliced = {**inputs, "x": inputs["x"][1:], "x_scales": inputs["x_scales"][1:]}
    assert sliced["x_scales"].data_ptr() % 16  # the case this test is about
    copied = {**sliced, "x": sliced["x"].clone(), "x_scales": sliced["x_scales"].clone()}
    got, want = entry(**sliced), entry(**copied)
    assert torch.equal(checks.row_bytes(got), checks.row_bytes(want))


@pytest.mark.parametrize("value", ["abc", "-2", "1.5"])
def test_a_bad_compile_workers_value_names_the_variable(value, monkeypatch):
    monkeypatch.setenv(warm_up.WORKERS_ENV, value)
    import amd_kernels.norm.rmsnorm_h2880 as pkg

    monkeypatch.setattr(warm_up, "_pool", None)
    with pytest.raises(ValueError, match=f"^{warm_up.WORKERS_ENV}: .*{value!r}"):
        warm_up._compile_in_workers(pkg.VARIANTS, ["rmsnorm.decode", "rmsnorm.prefill"], "t")


def test_torch_compile_raises_the_argument_error_while_tracing():
    """Under torch.compile the op's fake runs at trace time: a bad argument fails there, with the entry's
    own error, before any graph reaches the backend (a fake without checks would trace and compile)."""
    import amd_kernels.norm.rmsnorm_h2880 as pkg

    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    x = torch.zeros(4, 2880, dtype=torch.bfloat16, device=devices.current().torch_device)
    weight = torch.zeros(2880, dtype=torch.float32, device=x.device)  # bf16 expected
    compiled = torch.compile(lambda a, w: pkg.rmsnorm(a, w, 1e-6), backend=backend, fullgraph=True)
    with pytest.raises(Exception, match="weight: expected dtype torch.bfloat16, got torch.float32"):
        compiled(x, weight)
    assert graphs == []


def test_plain_eager_call_matches_the_dispatcher():
    """A plain eager call runs the entry without torch's dispatcher (host.EntryOp): the same bytes as the
    dispatched op, the same argument errors, and the mutated arguments' version counters bumped."""
    import amd_kernels.attention.rope_kv_q8_kv1_d64 as rope
    import amd_kernels.quant.mxfp8_k512 as quant
    from amd_kernels import host
    from harness import emulator

    assert isinstance(quant.mxfp8_quant, host.EntryOp)
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    x = x.to(devices.current().torch_device)
    fast, dispatched = quant.mxfp8_quant(x), quant.mxfp8_quant._opoverload(x)
    for a, b in zip(fast, dispatched):
        assert torch.equal(a.cpu().view(torch.uint8), b.cpu().view(torch.uint8))
    bad = x.float()
    with pytest.raises(TypeError) as fast_err:
        quant.mxfp8_quant(bad)
    with pytest.raises(TypeError) as dispatched_err:
        quant.mxfp8_quant._opoverload(bad)
    assert str(fast_err.value) == str(dispatched_err.value) and str(fast_err.value).startswith("x: ")

    spec = next(s for s in cases.op_shapes() if s.kernel == "attention/rope_kv_q8_kv1_d64" and s.op == "rope_kv_write")
    inputs = checks.to_device(OPS[spec.op].build_inputs(1, spec.dims, 0), devices.current().torch_device)
    before = (inputs["key_cache"]._version, inputs["value_cache"]._version, inputs["qkv"]._version)
    with emulator.options(execute=False) if devices.current().emulated else contextlib.nullcontext():
        rope.rope_kv_write(**inputs)
    after = (inputs["key_cache"]._version, inputs["value_cache"]._version, inputs["qkv"]._version)
    assert after == (before[0] + 1, before[1] + 1, before[2]), (before, after)


def test_cached_environment_is_reread_by_reload_env(monkeypatch):
    """The host code reads its switches once per process; reload_env() re-reads them."""
    from amd_kernels import host

    monkeypatch.setenv("AMD_KERNELS_TEST_FLAG", "1")
    host.reload_env()
    assert host.env_flag("AMD_KERNELS_TEST_FLAG")
    monkeypatch.setenv("AMD_KERNELS_TEST_FLAG", "0")
    assert host.env_flag("AMD_KERNELS_TEST_FLAG")  # cached until re-read
    host.reload_env()
    assert not host.env_flag("AMD_KERNELS_TEST_FLAG")
    monkeypatch.setenv(host.EAGER_DISPATCH_ENV, "1")
    host.reload_env()
    try:
        assert host._always_dispatch
    finally:
        monkeypatch.delenv(host.EAGER_DISPATCH_ENV)
        host.reload_env()
    assert not host._always_dispatch
