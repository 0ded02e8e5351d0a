"""The standard checks of every registered kernel, generated from the regimes.

No kernel needs a test file of its own for these; a kernel package may add tests for what is special
about it.
"""

from __future__ import annotations

import os

import pytest
import torch

from harness import cases, checks, discovery
from harness import device as devices
from harness.isa import cards, code_object_of
from amd_kernels import compile_watch
from references import OPS

SHAPES = cases.op_shapes()
PACKAGES = discovery.discover()


def _entry(shape: cases.OpShape):
    pkg = PACKAGES[shape.kernel]
    return pkg, pkg.import_entries()[pkg.entry_for_op(shape.op)]


def _inputs(shape: cases.OpShape, tokens: int, seed: int) -> dict:
    """The entry's inputs at `tokens` rows, on the executing device."""
    pkg = PACKAGES[shape.kernel]
    inputs = OPS[shape.op].build_inputs(tokens, shape.dims, seed)
    return checks.to_device(pkg.entry_inputs(pkg.entry_for_op(shape.op), inputs), devices.current().torch_device)


def test_regimes_and_declarations_agree():
    assert cases.validate() == []


# A kernel too slow to emulate at every token count lists the ones the emulator checks by default in its
# kernel.toml ([emulator] token_counts); AMD_KERNELS_FULL=1 checks every count. A GPU always checks all.
FULL = os.environ.get("AMD_KERNELS_FULL", "") not in ("", "0")


def _numeric_param(shape, count):
    marks = []
    subset = PACKAGES[shape.kernel].emulator_token_counts if shape.kernel in PACKAGES else ()
    if subset and count.tokens not in subset and not FULL and devices.current().emulated:
        marks.append(pytest.mark.skip(reason=f"emulator: {count.tokens} tokens is outside kernels/{shape.kernel}"
                                      "'s emulated set; AMD_KERNELS_FULL=1 runs it"))
    return pytest.param(shape, count, id=f"{shape.kernel}:{shape.op}:m{count.tokens}r{count.real}", marks=marks)


NUMERIC_CASES = [_numeric_param(shape, count) for shape in SHAPES for count in shape.token_counts]


@pytest.mark.parametrize("shape,count", NUMERIC_CASES)
def test_numerics(shape, count):
    """Cosine against the reference, bitwise determinism and harmless padding rows at one token count."""
    pkg, entry = _entry(shape)
    seed = checks.seed_of(shape.id, count.tokens, count.real)
    result = checks.check_case(pkg, entry, shape.op, shape.dims, count.tokens, count.real, seed)
    assert result.failures(OPS[shape.op].cosine_min) == [], result


INVARIANCE_CASES = [_numeric_param(shape, count) for shape in SHAPES if OPS[shape.op].sub_batch is not None
                    for count in shape.token_counts]


@pytest.mark.parametrize("shape,count", INVARIANCE_CASES)
def test_batch_invariance(shape, count):
    """A few sequences' output bits are the same alone as inside the (padded) batch."""
    pkg, entry = _entry(shape)
    seed = checks.seed_of("invariance", shape.id, count.tokens, count.real)
    result = checks.check_batch_invariance(pkg, entry, shape.op, shape.dims, count.tokens, count.real, seed)
    assert result["elements"] > 0 and result["same"], result


ENTRY_SHAPES = {(s.kernel, s.op): s for s in SHAPES}


@pytest.mark.parametrize("shape", list(ENTRY_SHAPES.values()), ids=lambda s: s.id)
def test_isa_cards(shape):
    """Every variant the entry can hit compiles for gfx950 with no scratch and no floating-point atomic."""
    _, entry = _entry(shape)
    entry.warm_up()
    keys = sorted({k for ks in entry.modes.values() for k in ks})
    assert keys, "an entry with no variants"
    for key in keys:
        assert entry.table.is_loaded(key), f"{key} not loaded by warm-up"
        for card in cards(code_object_of(entry.table[key])):
            assert card.violations() == [], f"{key}: {card}"


@pytest.mark.parametrize("shape", list(ENTRY_SHAPES.values()), ids=lambda s: s.id)
def test_no_compile_after_warm_up(shape):
    """Warm every mode, then call every token count of the regimes: nothing may compile."""
    _, entry = _entry(shape)
    entry.warm_up()
    with compile_watch.recording() as events, checks.no_execution():
        for count in shape.token_counts:
            entry(**_inputs(shape, count.tokens, 0))
    assert compile_watch.serving_compiles(events) == []


@pytest.mark.parametrize("shape", list(ENTRY_SHAPES.values()), ids=lambda s: s.id)
def test_opcheck(shape):
    """The entry is a well-formed torch custom op (schema, fake tensor, dispatch)."""
    _, entry = _entry(shape)
    entry.warm_up()
    inputs = _inputs(shape, 2, 1)
    tensors = [t for t in inputs.values() if isinstance(t, torch.Tensor)]
    if any(t.dtype in _FP8 for t in tensors) or sum(t.nbytes for t in tensors) > _SCHEMA_CHECK_MAX_BYTES:
        # opcheck's test_schema compares inputs with torch.allclose: CPU torch has none for float8, and on
        # ~1 GB of expert weights its float temporaries exhaust memory. Check what it checks, bytewise.
        _assert_no_mutation_or_aliasing(entry, inputs, OPS[shape.op].mutates)
        tests = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
        torch.library.opcheck(entry, (), kwargs=inputs, test_utils=tests)
    else:
        torch.library.opcheck(entry, (), kwargs=inputs)


_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
_SCHEMA_CHECK_MAX_BYTES = 256 << 20


def _assert_no_mutation_or_aliasing(entry, inputs: dict, mutates: tuple = ()) -> None:
    """The schema's mutates_args (the op's `mutates`) and fresh outputs: no other input byte changes, no
    output aliases an input."""
    before = {k: v.clone() for k, v in inputs.items() if isinstance(v, torch.Tensor) and k not in mutates}
    outputs = entry(**inputs)
    outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
    for name, old in before.items():
        assert torch.equal(old.view(torch.uint8), inputs[name].view(torch.uint8)), f"the entry mutated {name}"
    input_storages = {v.untyped_storage().data_ptr() for v in inputs.values() if isinstance(v, torch.Tensor)}
    for i, out in enumerate(outputs):
        assert out.untyped_storage().data_ptr() not in input_storages, f"output {i} aliases an input"


def _bad_variants(inputs: dict):
    """(argument name, what is wrong, broken inputs): wrong dtype, wrong shape, non-contiguous."""
    for name, t in inputs.items():
        if not isinstance(t, torch.Tensor):
            continue
        wrong_dtype = torch.float32 if t.dtype != torch.float32 else torch.bfloat16
        yield name, "dtype", {**inputs, name: t.to(wrong_dtype)}
        yield name, "shape", {**inputs, name: t[..., :-32]}
        doubled = torch.cat([t, t], dim=-1)[..., ::2]
        if not doubled.is_contiguous():  # a one-element tensor (e.g. a per-tensor scale) stays contiguous
            yield name, "contiguous", {**inputs, name: doubled}


@pytest.mark.parametrize("shape", list(ENTRY_SHAPES.values()), ids=lambda s: s.id)
def test_bad_input_names_the_argument(shape, monkeypatch):
    _, entry = _entry(shape)
    inputs = _inputs(shape, 2, 2)
    for name, what, broken in _bad_variants(inputs):
        with pytest.raises((TypeError, ValueError)) as err:
            entry(**broken)
        assert name in str(err.value), f"{what} error for {name} does not name it: {err.value}"
    # A tensor on the host: on a GPU, move one; under the emulator, host tensors stop being accepted.
    if devices.current().emulated:
        monkeypatch.delenv(devices.DEVICE_ENV)
    first = next(n for n, t in inputs.items() if isinstance(t, torch.Tensor))
    with pytest.raises(ValueError, match=f"^{first}: .*device"):
        entry(**{**inputs, first: inputs[first].cpu()})
