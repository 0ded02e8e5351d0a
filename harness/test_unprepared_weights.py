"""An entry handed checkpoint-layout weights instead of prepared ones says which argument and what to do."""

from __future__ import annotations

import pytest
import torch

from harness import cases, checks, discovery
from harness import device as devices
from references import OPS

PACKAGES = discovery.discover()
PREPARED = [s for s in cases.op_shapes() if PACKAGES[s.kernel].prepare]
# category -> (prepared weight argument of the entry, the reference's checkpoint-layout argument)
_CHECKPOINT_NAME = {"gemm": ("w_packed", "w"), "moe": ("w13", "w13_blocks")}


@pytest.mark.parametrize("shape", PREPARED, ids=lambda s: s.id)
def test_checkpoint_layout_weight_names_the_argument_and_prepare_weights(shape):
    pkg = PACKAGES[shape.kernel]
    name = pkg.entry_for_op(shape.op)
    entry = pkg.import_entries()[name]
    raw = OPS[shape.op].build_inputs(2, shape.dims, 3)
    prepared = pkg.entry_inputs(name, raw)
    arg, ckpt = _CHECKPOINT_NAME[shape.kernel.split("/")[0]]
    assert prepared[arg].shape != raw[ckpt].shape  # otherwise this test could not tell them apart
    weight = raw[ckpt]
    if type(weight) is not torch.Tensor:
        # The MoE checkpoint is lazy (references.moe.LazyExperts): dispatching it would draw all of it (1.06 GB
        # at i2880) only to be rejected by its shape. A plain tensor of its shape and dtype, as a caller's
        # checkpoint is, never written: the entry must reject it before reading a byte.
        weight = torch.empty(weight.shape, dtype=weight.dtype)
    broken = checks.to_device({**prepared, arg: weight}, devices.current().torch_device)
    with pytest.raises((TypeError, ValueError), match=f"^{arg}: .*prepare_weights"):
        entry(**broken)
