"""PyTorch ground truth: one reference function per op, its contract and its input builder.

Every op is described by an `Op`: the reference function (whose docstring is the contract: rounding and
quantization points, scale layout, accumulate dtype, tolerance), the builder of seeded realistic inputs
(shared by the harness and the benchmarks), and how to turn outputs into fp32 tensors for comparison.
A kernel entry takes the same arguments as its reference and returns the same outputs.

This package imports only torch and numpy.
"""

from references.op import Op, cosine
from references import attention, gemm, moe, norm

OPS: dict[str, Op] = {op.name: op for op in norm.OPS}
OPS.update({op.name: op for op in moe.OPS})
OPS.update({op.name: op for op in gemm.OPS})
OPS.update({op.name: op for op in attention.OPS})

__all__ = ["OPS", "Op", "cosine"]
