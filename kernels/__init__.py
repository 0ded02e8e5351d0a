"""amd_kernels: FlyDSL kernels for AMD Instinct MI355X (gfx950), called directly by vLLM model code.

Every kernel package and its entry points: README.md beside this file. Importing a kernel package
registers its entries as torch custom ops under torch.ops.amd_kernels.
"""
