"""bf16 -> MXFP8 for rows of K = 512 (the input of gpt-oss-120b's attention output projection at TP 8).
Entry: mxfp8_quant(x) -> (q, scales); see README.md."""

from amd_kernels.quant import mxfp8_quant_entries

K = 512
_built = mxfp8_quant_entries.build(__name__, K)
VARIANTS = _built.VARIANTS  # the warm-up workers import it from here
mxfp8_quant = _built.mxfp8_quant
