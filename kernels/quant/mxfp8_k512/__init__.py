"""bf16 -> MXFP8 for rows of K = 512. Entry: mxfp8_quant(x) -> (q, scales); see README.md."""

from amd_kernels.quant import mxfp8_entries
from amd_kernels.quant.mxfp8_k512 import kernel

_built = mxfp8_entries.build(__name__, kernel.SHAPE_TOKEN, kernel.K, kernel.VARIANTS)
VARIANTS = _built.VARIANTS  # the warm-up workers import it from here
mxfp8_quant = _built.mxfp8_quant
