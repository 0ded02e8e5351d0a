"""The batch-invariance check itself: it passes for an entry whose rows depend only on their own sequence
and fails for one whose output depends on the batch (so a kernel that splits by batch size cannot pass)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from harness import checks
from references import attention

DIMS = {"query_heads": 8, "kv_heads": 1, "sliding_window": 0, "context_lengths": [1, 65, 130, 1000]}
PACKAGE = SimpleNamespace(workgroups="rows", sample_tokens=0, entry_for_op=lambda op: "paged_attention",
                          entry_inputs=lambda entry, inputs: inputs)


def _reference(**inputs):
    return attention.paged_attention(**inputs)[0]


def _batch_dependent(**inputs):
    """The reference, scaled by a factor that depends on how many sequences the batch holds."""
    out = attention.paged_attention(**inputs)[0]
    return (out.float() * (1 + inputs["seq_lens"].shape[0] * 2.0**-6)).to(torch.bfloat16)


def test_invariant_entry_passes():
    result = checks.check_sequence_invariance(PACKAGE, _reference, "paged_attention", DIMS, 8, 6, seed=3)
    assert result["same"] and result["elements"] > 0 and result["rows"] >= 1


def test_batch_dependent_entry_fails():
    result = checks.check_sequence_invariance(PACKAGE, _batch_dependent, "paged_attention", DIMS, 8, 6, seed=3)
    assert not result["same"]
