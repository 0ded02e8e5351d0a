"""bf16 -> MXFP8 quantization of rows of K = 4096 (the input of gpt-oss-120b's attention output projection
at TP 1). Kernel: kernels/quant/mxfp8_rows.py; contract: references/gemm.py (mxfp8_quant)."""

from amd_kernels.quant import mxfp8_rows

K = 4096
SHAPE_TOKEN = "mxfp8_k4096"
VARIANTS = mxfp8_rows.variants(K)
