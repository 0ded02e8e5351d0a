"""Device-side building blocks shared by the amd_kernels FlyDSL kernels (gfx950, wave64).

- `buffer`: buffer resources (V#) over a tensor or one row of it, 16/8/1-byte buffer loads and stores.
- `wave`: cross-lane reductions (DPP inside a 16-lane row, permlane/readlane across rows).
- `bf16`: packing and unpacking of 8 bf16 values held in one 16-byte register quad.
- `mxfp8`: OCP MXFP8 block quantization (E8M0 scale from an amax, E4M3 packing).

Everything here is a plain Python function that emits IR when called from inside a `@flyc.kernel` body.
None of it uses Python control flow on device values, so it can be called from any kernel.
"""
