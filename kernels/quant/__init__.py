"""Quantization kernels (bf16 -> MXFP8 for the MXFP8 GEMMs' activations)."""
