"""The standard checks of every registered kernel, generated from the regimes.

No kernel needs a test file of its own for these; a kernel package may add tests for what is special
about it.
"""

from __future__ import annotations

import hashlib
import os

import pytest
import torch

from harness import cases, checks, discovery
from harness import device as devices
from harness.isa import cards, code_object_of
from amd_kernels import compile_watch
from references import OPS

PACKAGES = discovery.discover()
# multi-rank packages (kernel.toml `ranks`) run their cases in harness/test_multirank.py
SHAPES = [s for s in cases.op_shapes() if s.kernel not in PACKAGES or PACKAGES[s.kernel].ranks == 1]


def _entry(shape: cases.OpShape):
    pkg = PACKAGES[shape.kernel]
    return pkg, pkg.import_entries()[pkg.entry_for_op(shape.op)]


def _hollow_inputs(shape: cases.OpShape, tokens: int, seed: int) -> dict:
    """The entry's inputs with their real shapes, dtypes and strides but no data (fresh memory, never
    written): for calls that must fail their checks before any launch. The input builder and prepare run on
    fake tensors (references' lru_caches bypassed, so nothing fake is cached), so the TP1 MoE's ~3.3 GB of
    checkpoint and prepared weights are never materialized."""
    import importlib
    import pkgutil

    import references
    from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensorMode

    cached = [(m, name, fn) for m in (importlib.import_module(f"references.{i.name}")
                                      for i in pkgutil.iter_modules(references.__path__))
              for name, fn in vars(m).items() if hasattr(fn, "cache_clear") and hasattr(fn, "__wrapped__")]
    pkg = PACKAGES[shape.kernel]
    try:
        for m, name, fn in cached:
            setattr(m, name, fn.__wrapped__)
        try:
            with FakeTensorMode(allow_non_fake_inputs=True):
                fake = pkg.entry_inputs(pkg.entry_for_op(shape.op),
                                        OPS[shape.op].build_inputs(tokens, shape.dims, seed))
        except DataDependentOutputException:  # a builder that reads its own data (attention's block tables)
            fake = pkg.entry_inputs(pkg.entry_for_op(shape.op), OPS[shape.op].build_inputs(tokens, shape.dims, seed))
    finally:
        for m, name, fn in cached:
            setattr(m, name, fn)
    dev = devices.current().torch_device

    def hollow(t: torch.Tensor) -> torch.Tensor:
        out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=dev)
        # small ones zeroed, so token ids stay in range should a missing check let a launch through
        return out.zero_() if t.nbytes < (1 << 20) else out

    return {k: hollow(v) if isinstance(v, torch.Tensor) else v for k, v in fake.items()}


def _inputs(shape: cases.OpShape, tokens: int, seed: int) -> dict:
    """The entry's inputs at `tokens` rows, on the executing device."""
    pkg = PACKAGES[shape.kernel]
    inputs = OPS[shape.op].build_inputs(tokens, shape.dims, seed)
    return checks.to_device(pkg.entry_inputs(pkg.entry_for_op(shape.op), inputs), devices.current().torch_device)


def test_regimes_and_declarations_agree():
    assert cases.validate() == []


# A kernel too slow to emulate at every token count lists the ones the emulator checks by default in its
# kernel.toml ([emulator] token_counts, or per op [emulator.op_token_counts]); AMD_KERNELS_FULL=1 checks every
# count. A GPU always checks all.
FULL = os.environ.get("AMD_KERNELS_FULL", "") not in ("", "0")


def _numeric_param(shape, count):
    marks = []
    pkg = PACKAGES.get(shape.kernel)
    if pkg and not FULL and not pkg.checked_by_default(shape.op, count.tokens, devices.current().emulated):
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


SEQUENCE_INVARIANCE_CASES = [_numeric_param(shape, count) for shape in SHAPES
                             if OPS[shape.op].sub_batch is not None for count in shape.token_counts]


@pytest.mark.parametrize("shape,count", SEQUENCE_INVARIANCE_CASES)
def test_sequence_invariance(shape, count):
    """A few sequences' output bits are the same alone as inside the (padded) batch."""
    pkg, entry = _entry(shape)
    seed = checks.seed_of("invariance", shape.id, count.tokens, count.real)
    result = checks.check_sequence_invariance(pkg, entry, shape.op, shape.dims, count.tokens, count.real, seed)
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
        if sum(t.nbytes for t in tensors) > _SCHEMA_CHECK_MAX_BYTES:
            # opcheck clones every input for each of its checks (~1.7 GB a copy for the TP1 MoE). The entry
            # mutates nothing else (just checked), so run its checks on the inputs themselves; its autograd
            # registration check returns early anyway, as no input requires grad.
            from torch.testing._internal.optests import aot_autograd_check, fake_check

            assert not any(t.requires_grad for t in tensors)
            fake_check(entry._opoverload, (), inputs)
            aot_autograd_check(entry._opoverload, (), inputs, True, check_gradients="auto")
        else:
            tests = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
            torch.library.opcheck(entry, (), kwargs=inputs, test_utils=tests)
    else:
        torch.library.opcheck(entry, (), kwargs=inputs)


_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
# opcheck's test_schema clones every input and compares it after the call with torch.allclose, whose float
# temporaries take ~13x the inputs' bytes (3 GB of peak for the TP8 MoE's 233 MB of prepared weights): above
# this, the same checks run bytewise on the inputs themselves. Every non-MoE entry's inputs are below 33 MB.
_SCHEMA_CHECK_MAX_BYTES = 64 << 20


def _digest(t: torch.Tensor) -> bytes:
    """A hash of the tensor's bytes (no copy on the host: a clone of the MoE's weights would be ~1.7 GB)."""
    return hashlib.blake2b(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()).digest()


def _assert_no_mutation_or_aliasing(entry, inputs: dict, mutates: tuple = ()) -> None:
    """The schema's mutates_args (the op's `mutates`) and fresh outputs: no other input byte changes, no
    output aliases an input."""
    def state(t: torch.Tensor) -> tuple:  # bytes and metadata (opcheck's test_schema checks both)
        return _digest(t), tuple(t.shape), t.stride(), t.data_ptr()

    before = {k: state(v) for k, v in inputs.items() if isinstance(v, torch.Tensor) and k not in mutates}
    outputs = entry(**inputs)
    outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
    for name, old in before.items():
        assert old == state(inputs[name]), f"the entry mutated {name}"
    input_storages = {v.untyped_storage().data_ptr() for v in inputs.values() if isinstance(v, torch.Tensor)}
    for i, out in enumerate(outputs):
        assert out.untyped_storage().data_ptr() not in input_storages, f"output {i} aliases an input"


def _bad_variants(inputs: dict):
    """(argument name, what is wrong, broken inputs): wrong dtype, wrong shape, non-contiguous.

    The broken tensors are fresh uninitialized memory or views, never converted copies: the entry must
    reject them before reading a byte, and the MoE's ~1 GB of expert weights would otherwise be copied to
    float32 and doubled (over 10 GB for one test worker)."""
    for name, t in inputs.items():
        if not isinstance(t, torch.Tensor):
            continue
        wrong_dtype = torch.float32 if t.dtype != torch.float32 else torch.bfloat16
        yield name, "dtype", {**inputs, name: torch.empty(t.shape, dtype=wrong_dtype, device=t.device)}
        yield name, "shape", {**inputs, name: t[..., :-32]}
        strides, step = [], 1  # row-major strides of the shape with its last dimension doubled, then [..., ::2]
        for size in reversed((*t.shape[:-1], 2 * t.shape[-1])):
            strides.insert(0, step)
            step *= size
        strides[-1] = 2
        strided = torch.empty_strided(t.shape, strides, dtype=t.dtype, device=t.device)
        if not strided.is_contiguous():  # a one-element tensor (e.g. a per-tensor scale) stays contiguous
            yield name, "contiguous", {**inputs, name: strided}


def _fake_call(entry, inputs: dict):
    """Call the entry as torch.compile traces it: on fake tensors, which dispatch to the op's fake."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        return entry(**{k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()})


@pytest.mark.parametrize("shape", list(ENTRY_SHAPES.values()), ids=lambda s: s.id)
def test_bad_input_names_the_argument(shape, monkeypatch):
    """Every bad argument gets an error naming it, the same from a real call, from the op's fake (what
    torch.compile traces with) and on the meta device."""
    _, entry = _entry(shape)
    entry.warm_up()  # every call below must fail its checks: no launch, so the inputs need no data
    inputs = _hollow_inputs(shape, 2, 2)
    for name, what, broken in _bad_variants(inputs):
        with pytest.raises((TypeError, ValueError)) as err:
            entry(**broken)
        assert name in str(err.value), f"{what} error for {name} does not name it: {err.value}"
        with pytest.raises(type(err.value)) as fake_err:
            _fake_call(entry, broken)
        assert str(fake_err.value) == str(err.value), f"{what} error for {name}: the fake raised another error"
    first = next(n for n, t in inputs.items() if isinstance(t, torch.Tensor))
    meta = {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    with pytest.raises(ValueError, match=f"^{first}: .*device meta"):
        entry(**meta)
    # A tensor on the host: on a GPU, move one; under the emulator, host tensors stop being accepted.
    from amd_kernels import host

    if devices.current().emulated:
        monkeypatch.delenv(devices.DEVICE_ENV)
        host.reload_env()  # the host code reads AMD_KERNELS_DEVICE once per process
    try:
        with pytest.raises(ValueError, match=f"^{first}: .*device"):
            entry(**{**inputs, first: inputs[first].cpu()})
    finally:
        monkeypatch.undo()
        host.reload_env()


def _invariance_param(shape, cancelling):
    kind = "cancelling" if cancelling else "realistic"
    return pytest.param(shape, cancelling, id=f"{shape.id}:{kind}")


# ops over a batch of sequences (Op.sub_batch) check it per sequence: test_sequence_invariance
INVARIANCE_CASES = [_invariance_param(s, c) for s in ENTRY_SHAPES.values() for c in (False, True)
                    if OPS[s.op].sub_batch is None and (not c or OPS[s.op].build_cancelling is not None)]


@pytest.mark.parametrize("shape,cancelling", INVARIANCE_CASES)
def test_batch_invariance(shape, cancelling):
    """A row's output bits are the same alone, first or last in a batch, at token counts on both sides of every
    tier edge up to the largest prefill; on realistic inputs and on inputs built to expose summation order."""
    pkg, entry = _entry(shape)
    entry.warm_up()
    counts = checks.invariance_counts(pkg, max(c.tokens for c in shape.token_counts), shape.op)
    failures = checks.check_batch_invariance(pkg, entry, shape.op, shape.dims, counts,
                                             checks.seed_of("invariance", shape.id), cancelling)
    assert failures == [], "\n".join(failures[:20])


BOUNDED_SHAPES = list(ENTRY_SHAPES.values())


@pytest.mark.parametrize("shape", BOUNDED_SHAPES, ids=lambda s: s.id)
def test_token_count_bound(shape):
    """Above its token bound an entry raises an error naming its token-row input (x, qkv, ...) and the bound;
    the bound covers the regimes' largest prefill, and a batch of exactly the bound passes the token check
    (zero-stride rows: no memory)."""
    _, entry = _entry(shape)
    entry.warm_up()
    limit = entry.max_tokens
    assert limit >= max(c.tokens for c in shape.token_counts)
    inputs = _inputs(shape, 1, 3)
    name = OPS[shape.op].row_inputs[0]
    for rows in (limit + 1, limit):
        huge = {**inputs, name: inputs[name][:1].expand(rows, *inputs[name].shape[1:])}
        with pytest.raises(ValueError) as err:
            entry(**huge)
        if rows > limit:
            assert str(err.value).startswith(f"{name}: ") and str(limit) in str(err.value), err.value
        else:  # past the bound check: the next check rejects the zero-stride x
            assert "token rows" not in str(err.value) and "contiguous" in str(err.value), err.value


SPECIAL_SHAPES = [s for s in ENTRY_SHAPES.values() if OPS[s.op].build_special is not None]


@pytest.mark.parametrize("shape", SPECIAL_SHAPES, ids=lambda s: s.id)
def test_special_values(shape):
    """NaN, +-Inf and subnormal inputs give what the reference's contract says (NaN and Inf positions exact)."""
    pkg, entry = _entry(shape)
    failures = checks.check_special_values(pkg, entry, shape.op, shape.dims, checks.seed_of("special", shape.id))
    assert failures == [], "\n".join(failures[:20])
