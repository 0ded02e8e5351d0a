"""The check path's sampling (harness/checks.py Case), without running a kernel: every kernel.toml
`workgroups` kind is one the harness knows, a "tokens" package defines its hook, and a case samples only
where it may (emulator, above sample_above_tokens, an op that mutates no argument)."""

from __future__ import annotations

import dataclasses
import importlib
from types import SimpleNamespace

import pytest
import torch

from harness import cases, checks, discovery
from harness import device as devices
from references import OPS

PACKAGES = discovery.discover()


@pytest.mark.parametrize("pkg", [p for p in PACKAGES.values() if p.workgroups], ids=lambda p: p.path)
def test_declared_kinds_are_known(pkg):
    assert pkg.workgroups in checks.SAMPLINGS
    if checks.SAMPLINGS[pkg.workgroups].token_axis is None:
        assert callable(getattr(importlib.import_module(pkg.module), checks.TOKENS_HOOK, None))


def _case(kernel: str, op: str, tokens: int, real: int) -> checks.Case:
    shape = next(s for s in cases.op_shapes() if (s.kernel, s.op) == (kernel, op))
    return checks.Case(PACKAGES[kernel], None, op, shape.dims, tokens, real, 0)


@pytest.mark.skipif(not devices.current().emulated, reason="emulator sampling (a GPU runs every workgroup)")
def test_a_case_samples_only_where_it_may():
    gemm = "gemm/mxfp8_n2880_k512"
    small = _case(gemm, "mxfp8_gemm", PACKAGES[gemm].sample_above_tokens, 1)
    assert small.sampling is None and small.emulator_options() == {}
    big = _case(gemm, "mxfp8_gemm", 256, 256)
    assert big.sampling == checks.SAMPLINGS["tiles"] and big.emulator_options()["workgroup_sample"] > 0
    # an op's own threshold ([emulator.op_sample_above_tokens]) wins over the package's
    own = dataclasses.replace(PACKAGES[gemm], emulator_op_sample_above_tokens={"mxfp8_gemm": 256})
    assert dataclasses.replace(big, package=own).sampling is None
    rope = _case("attention/rope_kv_q8_kv1_d64", "rope_kv_write", 8192, 8192)  # mutates the KV cache
    assert rope.sampling is None
    for path in [p for p in PACKAGES if p.startswith("moe/mxfp4_")]:  # the floor: 8 sampled MoE rows
        moe = _case(path, next(iter(PACKAGES[path].entries.values())), 64, 57)
        rows = moe.emulator_options()["workgroup_filter"].args[0]
        assert len(rows) == checks.sample_tokens(PACKAGES[path]) >= 8 and max(rows) < 57, path
    paged = _case("attention/paged_q8_kv1_d64", "paged_attention", 64, 57)
    assert len(paged.emulator_options()["workgroup_filter"].args[0]) == checks.EMULATOR_SAMPLE_TOKENS


def _torch_case(entry, tokens: int, real: int) -> checks.Case:
    """A rmsnorm case whose entry is plain torch (no launch): the check path's comparisons alone."""
    shape = next(s for s in cases.op_shapes() if s.op == "rmsnorm")
    package = SimpleNamespace(entry_for_op=lambda op: "entry", entry_inputs=lambda name, inputs: inputs,
                              sample_above=lambda op: tokens, workgroups="")
    return checks.Case(package, entry, "rmsnorm", shape.dims, tokens, real, 0)


def _reference(**inputs) -> torch.Tensor:
    (out,) = OPS["rmsnorm"].reference(**inputs)
    return out.to(torch.bfloat16)


def test_a_sound_entry_passes_in_two_runs():
    calls = []
    result = _torch_case(lambda **k: calls.append(1) or _reference(**k), 8, 5).check()
    assert result.failures(0.999) == [] and len(calls) == 2


@pytest.mark.skipif(not devices.current().emulated, reason="a seeded workgroup order is the emulator's")
def test_an_order_dependent_entry_is_caught():
    from harness.emulator import runtime

    def entry(**inputs):  # under another workgroup order one element moves by one ulp
        out = _reference(**inputs).clone()
        if runtime.current_options().get("workgroup_order_seed") is not None:
            out[0, 0] = torch.nextafter(out[0, 0], out[0, 0] + 1)
        return out

    for tokens, real in ((8, 5), (8, 8)):
        result = _torch_case(entry, tokens, real).check()
        assert not result.deterministic and result.padding_harmless, (tokens, real)
        assert "two runs gave different bytes" in result.failures(0.999)


def test_a_padding_leak_is_caught_and_told_from_order():
    def entry(**inputs):  # row 0 reads the last (padding) row
        out = _reference(**inputs).clone()
        out[0, 0] += inputs["x"][-1].float().abs().max().to(out.dtype)
        return out

    result = _torch_case(entry, 8, 5).check()
    assert result.deterministic and not result.padding_harmless
    assert "garbage in graph-padding rows changed real rows" in result.failures(0.999)


def test_stored_mask_marks_the_elements_whose_every_byte_was_stored():
    """checks.stored_mask (merged intervals, an element difference array) against a byte map built interval
    by interval: overlapping, adjacent, empty and element-straddling intervals, some partly or wholly outside
    the tensor, several launches, one with no stores; 1-, 2-, 4- and 8-byte elements."""
    import numpy as np

    rng = np.random.default_rng(1)
    for trial in range(300):
        t = torch.zeros(int(rng.integers(1, 300)), dtype=(torch.uint8, torch.bfloat16, torch.float32,
                                                          torch.int64)[trial % 4])
        lo, nbytes = t.data_ptr(), t.numel() * t.element_size()
        records = [SimpleNamespace(stored=None)]
        for _ in range(int(rng.integers(0, 4))):
            starts = rng.integers(lo - 20, lo + nbytes + 20, int(rng.integers(0, 30)))
            records.append(SimpleNamespace(stored=np.stack([starts, starts + rng.integers(0, 12, len(starts))],
                                                           axis=1).astype(np.int64).reshape(-1, 2)))
        byte = np.zeros(nbytes, bool)
        for rec in records[1:]:
            for s, e in rec.stored:
                byte[max(s, lo) - lo: max(min(e, lo + nbytes) - lo, 0)] = True
        want = torch.from_numpy(byte.reshape(-1, t.element_size()).all(axis=1))
        assert torch.equal(checks.stored_mask(records, t), want), trial
