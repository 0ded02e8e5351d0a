"""Targeted checks of the MXFP4 MoE packages' contract (references/moe.py) that the generated cases cannot
see: TP8 partials summed over the ranks against TP1. Each case runs the kernels (emulator or GPU) at a few
tokens; they are heavy (every selected expert's weights go through emulated MFMAs): run this file alone."""

from __future__ import annotations

import functools

import pytest
import torch

from harness import checks, discovery
from harness import device as devices
from references import OPS
from references.moe import MOE_COSINE_MIN

GPTOSS = {"hidden": 2880, "intermediate": 2880, "experts": 128, "top_k": 4}
TP8 = "moe/mxfp4_h2880_i384_e128_top4"


@functools.lru_cache(maxsize=None)
def _entry(package: str, op: str):
    pkg = discovery.discover()[package]
    name = pkg.entry_for_op(op)
    return pkg, name, pkg.import_entries()[name]


def run(package: str, op: str, raw: dict) -> torch.Tensor:
    """The package's entry on reference inputs (checkpoint layout, prepared by the package), on the device."""
    pkg, name, entry = _entry(package, op)
    inputs = checks.to_device(pkg.entry_inputs(name, raw), devices.current().torch_device)
    return entry(**inputs).cpu()


def test_tp8_rank_partials_sum_to_tp1():
    """vLLM all-reduces the 8 ranks' partials: summed in rank order they match the TP1 reference (a sum
    order change and the partials' bf16 rounding, so by cosine, not bitwise)."""
    op = OPS["moe_mxfp4_gptoss"]
    tokens = 3
    total = torch.zeros(tokens, GPTOSS["hidden"])
    for rank in range(8):
        raw = op.build_inputs(tokens, {**GPTOSS, "tp_size": 8, "tp_rank": rank}, 11)
        total += run(TP8, "moe_mxfp4_gptoss", raw).float()
    (tp1,) = op.reference(**op.build_inputs(tokens, {**GPTOSS, "tp_size": 1, "tp_rank": 0}, 11))
    assert checks.cosine(total, tp1.float()) >= MOE_COSINE_MIN
