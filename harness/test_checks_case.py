"""The check path's sampling (harness/checks.py Case), without running a kernel: every kernel.toml
`workgroups` kind is one the harness knows, a "tokens" package defines its hook, and a case samples only
where it may (emulator, above sample_above_tokens, an op that mutates no argument)."""

from __future__ import annotations

import importlib

import pytest

from harness import cases, checks, discovery
from harness import device as devices

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
    rope = _case("attention/rope_kv_q8_kv1_d64", "rope_kv_write", 8192, 8192)  # mutates the KV cache
    assert rope.sampling is None
    moe = _case("moe/mxfp4_h2880_i384_e128_top4", "moe_mxfp4_gptoss", 64, 57)
    rows = moe.emulator_options()["workgroup_filter"].args[0]
    assert len(rows) == checks.EMULATOR_SAMPLE_TOKENS and max(rows) < 57
