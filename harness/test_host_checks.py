"""Host-side errors that must say what is wrong: another package's weights, a bad environment variable,
and a row slice of a tensor the kernel reads bytewise (accepted)."""

from __future__ import annotations

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
    monkeypatch.setattr(warm_up, "_pool", None)
    with pytest.raises(ValueError, match=f"^{warm_up.WORKERS_ENV}: .*{value!r}"):
        warm_up._compile_in_workers("amd_kernels.norm.rmsnorm_h2880", ["rmsnorm.decode", "rmsnorm.prefill"], "t")


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
