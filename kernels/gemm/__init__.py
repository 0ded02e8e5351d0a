"""GEMM kernels (MXFP8 linear layers with preshuffled weights)."""
