"""bf16 -> MXFP8 quantization of rows of K = 512 (the input of gpt-oss-120b's attention output projection
at TP 8). Kernel: kernels/quant/mxfp8_rows.py; contract: references/gemm.py (mxfp8_quant)."""

from amd_kernels.quant import mxfp8_rows

K = 512
SHAPE_TOKEN = "mxfp8_k512"
VARIANTS = mxfp8_rows.variants(K)
