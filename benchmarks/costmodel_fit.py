"""Constants fitted by `python -m benchmarks.calibrate --write` (do not edit by hand)."""

FIT = {"launch_us": 2.2984, "wait_cycles": 5.144, "barrier_cycles": 639.9177, "hbm_efficiency": 0.9225, "overlap": 0.478, "cu_bytes_per_clk": 31.3765}
