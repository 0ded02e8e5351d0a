"""Constants fitted by `python -m benchmarks.calibrate --write` (do not edit by hand)."""

FIT = {"launch_us": 2.427, "wait_cycles": 0.0, "barrier_cycles": 746.9136, "hbm_efficiency": 0.9241, "overlap": 0.4908, "cu_bytes_per_clk": 30.6975}
