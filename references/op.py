"""What the harness needs to know of an op, and the cosine it checks with."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class Op:
    name: str
    reference: Callable  # (**inputs) -> tuple of output tensors
    build_inputs: Callable  # (tokens, dims: dict, seed) -> dict of named inputs (row-major, token rows first)
    to_float: Callable  # (outputs tuple) -> tuple of fp32 tensors [tokens, ...], one per compared result
    result_names: tuple[str, ...]  # a name per to_float result, for reports
    cosine_min: float  # each result's cosine against the reference must reach this
    row_inputs: tuple[str, ...]  # inputs whose first dim is the token dim (graph padding rows live there)
    # Inputs built to expose summation order (large partial sums that cancel), same signature as
    # build_inputs; None where the op sums nothing order-sensitive. Used by the batch-invariance check.
    build_cancelling: Callable | None = None
    # Inputs with NaN, +-Inf and subnormal values planted (special_rows below), same signature; None where
    # the contract does not define special values. Used by the special-values check.
    build_special: Callable | None = None
    # inputs the op writes in place (e.g. a KV cache); the custom op's schema declares them and the harness
    # compares them with the reference's after the call (harness/checks.py)
    mutates: tuple[str, ...] = ()
    # (row input, value) pairs: graph-padding rows of that input hold this value instead of garbage, as the
    # server pads them (e.g. slot_mapping -1 = write nothing, position 0)
    padding_values: tuple[tuple[str, float], ...] = ()
    # (inputs, real) -> inputs with rows real.. made graph padding in the op's other inputs too (e.g. the
    # sequence metadata of attention); None: the row inputs' padding rows are all there is.
    pad_inputs: Callable | None = None
    # (inputs, rows) -> (inputs of the sequences owning those token rows, alone; the full batch's rows the
    # sub-batch's rows 0, 1, ... are): ops whose batch is a list of sequences declare it, and the harness
    # checks batch invariance with it. The reference must give a sequence's bits whatever else is in the
    # batch: a sampled emulator case runs it on the sampled rows' sequences only
    # (harness/test_references.py::test_sequence_reference_alone_equals_in_the_batch).
    sub_batch: Callable | None = None
    # The reference and to_float compute each token row from that row of the row inputs alone (the other
    # inputs shared): the harness may then compute them on the rows it compares only (a sampled emulator case),
    # not on every row of the batch. Row-wise ops give each row's bits whatever rows come with it; a float64
    # matmul reference (mxfp8_gemm) could in principle differ in its last float64 bits with the row count, which
    # its output rounding absorbs (at 8192 tokens: reference(rows) == reference(all)[rows] bytewise).
    rows_independent: bool = False


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """Cosine similarity of two tensors flattened, in float64; 1.0 when both are all zero."""
    a = a.detach().reshape(-1).to(torch.float64)
    b = b.detach().reshape(-1).to(torch.float64)
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return float("nan")
    na, nb = a.norm(), b.norm()
    if na == 0 and nb == 0:
        return 1.0
    if na == 0 or nb == 0:
        return 0.0
    return float((a @ b) / (na * nb))


SPECIAL_ROWS = 8  # the rows special_rows() plants; a special-values builder makes at least this many


def special_rows(x: torch.Tensor, seed: int) -> torch.Tensor:
    """A copy of bf16 x [tokens >= SPECIAL_ROWS, k >= 128] with special values planted: row 0 unchanged, row 1
    one NaN, row 2 one +Inf, row 3 one -Inf, row 4 all subnormal (~2^-130), row 5 one 32-block subnormal,
    row 6 all zero, row 7 one NaN with the sign bit set. Rows past 7 unchanged."""
    if x.shape[0] < SPECIAL_ROWS or x.shape[1] < 128:
        raise ValueError(f"x: special_rows needs >= {SPECIAL_ROWS} rows and 128 columns, got {list(x.shape)}")
    gen = torch.Generator().manual_seed(seed)
    y = x.clone()
    y[1, 5] = float("nan")
    y[2, 7] = float("inf")
    y[3, 40] = float("-inf")
    y[4] = (torch.randn(x.shape[1], generator=gen) * 2.0**-130).to(x.dtype)
    y[5, 32:64] = (torch.randn(32, generator=gen) * 2.0**-130).to(x.dtype)
    y[6] = 0
    bits = y.view(torch.int16)
    bits[7, 70] = -64  # 0xFFC0: a NaN with the sign bit set
    return y
