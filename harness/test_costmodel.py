"""The cost model (benchmarks/costmodel.py) on synthetic launches: rates from the published figures, the tail
of a grid one workgroup past the CUs, occupancy and memory scaling. No emulation: plain dicts."""

import csv

import pytest

from benchmarks import costmodel
from benchmarks.calibrate import POINTS


def _launch(workgroups=256, wg_size=256, vgprs=64, lds=0, mfma=0, valu=100, waitcnt=10, load_bytes=0):
    waves = workgroups * (wg_size // 64)
    return {"kernel": "k", "workgroups": workgroups, "wg_size": wg_size, "ran": workgroups, "sampled": False,
            "vgprs": vgprs, "agprs": 0, "lds_bytes": lds, "fp4": False,
            "instructions": {"valu": valu * waves, "waitcnt": waitcnt * waves, "mfma": mfma * waves},
            "mfma": {"v_mfma_f32_16x16x128_f8f6f4": mfma * waves} if mfma else {},
            "counters": {"waves": waves, "global_load_bytes": load_bytes, "global_load_distinct_bytes": load_bytes}}


def test_mfma_cycles_follow_the_published_peaks():
    # FP8 8192 FLOP/clk/CU: a 16x16x128 MFMA (65536 FLOP) takes 32 cycles on one of the 4 SIMDs.
    assert costmodel.mfma_cycles("v_mfma_f32_16x16x128_f8f6f4") == 32
    assert costmodel.mfma_cycles("v_mfma_scale_f32_16x16x128_f8f6f4", fp4=True) == 16
    assert costmodel.mfma_cycles("v_mfma_f32_16x16x32_bf16") == 16
    assert costmodel.mfma_cycles("v_mfma_f32_32x32x16_bf16") == 32


def test_one_workgroup_past_the_cus_costs_a_second_round():
    a = costmodel.project_launch(_launch(workgroups=256, mfma=2000))
    b = costmodel.project_launch(_launch(workgroups=257, mfma=2000))
    assert b["workgroups_per_cu"] == 2 and a["workgroups_per_cu"] == 1
    assert b["terms_us"]["issue"] == pytest.approx(2 * a["terms_us"]["issue"])   # the MFMA pipe runs two waves
    assert b["us"] - costmodel.FITTED.launch_us > 1.4 * (a["us"] - costmodel.FITTED.launch_us)


def test_streaming_launch_approaches_the_hbm_rate():
    n = 1 << 30
    r = costmodel.project_launch(_launch(workgroups=4096, load_bytes=n))
    hbm_us = n / (costmodel.HBM_BYTES_PER_S * costmodel.FITTED.hbm_efficiency) * 1e6
    assert r["bound"] == "hbm"
    assert hbm_us <= r["us"] <= 1.5 * hbm_us + costmodel.FITTED.launch_us


def test_registers_limit_occupancy():
    assert costmodel.waves_per_simd(64, 0, 0, 256) == 8
    assert costmodel.waves_per_simd(256, 0, 0, 256) == 2
    assert costmodel.waves_per_simd(128, 128, 0, 256) == 2
    assert costmodel.waves_per_simd(64, 0, 80 * 1024, 256) == 2   # two 80 KiB workgroups per CU


@pytest.mark.parametrize("row", list(csv.DictReader(open(POINTS))), ids=lambda r: r["point"])
def test_every_calibration_point_names_its_source(row):
    assert float(row["published_us"]) > 0 and row["source"].strip()
