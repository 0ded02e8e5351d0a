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


def test_link_bytes_add_an_xgmi_term():
    """A multi-rank launch's peer bytes cost link time: 7 links of 76.8 GB/s each way, in parallel."""
    link = 7 * 64 * 5760
    r = costmodel.project_launch(_launch(workgroups=64), link_bytes=link)
    assert r["terms_us"]["xgmi"] == pytest.approx(link / (7 * 76.8e9) * 1e6)
    assert "xgmi" not in costmodel.project_launch(_launch(workgroups=64))["terms_us"]


def test_runner_floor_counts_link_bytes():
    from benchmarks.runner import Cost, floor_us

    f = floor_us(Cost(min_bytes=1000, flops=0, link_bytes=7 * 76.8e9 * 1e-6))  # one microsecond of links
    assert f["bound"] == "xgmi" and f["floor_us"] == pytest.approx(1.0)


def test_plot_option_writes_png_figures(tmp_path):
    """`runner --plot DIR` on a small case: a roofline and a projected-against-tokens figure, valid PNGs."""
    pytest.importorskip("matplotlib", reason="--plot needs the optional extra 'plot' (matplotlib)")
    from matplotlib import image

    from benchmarks import runner

    runner.main(["quant/mxfp8_k512", "--tokens", "1,8", "--plot", str(tmp_path)])
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == ["quant_mxfp8_k512.png", "roofline.png"]
    for name in written:
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        assert image.imread(tmp_path / name).shape[0] > 100


def test_plot_without_matplotlib_names_the_extra(monkeypatch):
    import sys

    from benchmarks import plots

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib then raises ImportError
    with pytest.raises(SystemExit, match=r"amd_kernels\[plot\]"):
        plots.require_matplotlib()
