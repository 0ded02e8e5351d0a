"""Narrow formats and gfx950 conversion instructions (harness/emulator/numerics.py)."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.emulator import numerics as N

RNG = np.random.default_rng(1234)
f32s = st.floats(width=32, allow_nan=True, allow_infinity=True)

# OCP MX v1.0 value tables (positive half), code order.
FP4_VALUES = [0, 0.5, 1, 1.5, 2, 3, 4, 6]
FP6_E2M3_TOP = [4, 4.5, 5, 5.5, 6, 6.5, 7, 7.5]
BF6_E3M2_TOP = [16, 20, 24, 28]


def _torch_codes(x: np.ndarray, dtype) -> np.ndarray:
    t = torch.from_numpy(x).to(dtype)
    return t.view(torch.uint8 if t.element_size() == 1 else torch.int16).numpy().astype(np.uint32) & (
        (1 << (8 * t.element_size())) - 1)


def _wide_sample(n=20000):
    """float32 values over the whole exponent range plus specials."""
    bits = RNG.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32).copy()
    return np.concatenate([x, np.float32([0, -0.0, np.inf, -np.inf, np.nan, 448, 464, 465, 480, 57344, 61440])])


# ------------------------------------------------------------------------------------- decode tables

def test_decode_small_tables():
    assert list(N.decode("fp4_e2m1", np.arange(8))) == FP4_VALUES
    assert list(N.decode("fp4_e2m1", np.arange(8, 16))) == [-v for v in FP4_VALUES]
    assert list(N.decode("fp6_e2m3", np.arange(24, 32))) == FP6_E2M3_TOP
    assert list(N.decode("bf6_e3m2", np.arange(28, 32))) == BF6_E3M2_TOP
    assert N.decode("fp6_e2m3", [1])[0] == 0.125 and N.decode("bf6_e3m2", [1])[0] == 0.0625
    assert N.max_finite("fp8_e4m3") == 448 and N.max_finite("bf8_e5m2") == 57344


@pytest.mark.parametrize("fmt,dtype", [("fp8_e4m3", torch.float8_e4m3fn), ("bf8_e5m2", torch.float8_e5m2),
                                       ("e8m0", torch.float8_e8m0fnu)])
def test_decode_all_bytes_match_torch(fmt, dtype):
    codes = np.arange(256, dtype=np.uint8)
    ref = torch.from_numpy(codes).view(dtype).float().numpy()
    got = N.decode(fmt, codes)
    assert np.array_equal(np.isnan(got), np.isnan(ref))
    ok = ~np.isnan(ref)
    assert np.array_equal(got[ok], ref[ok]) and np.array_equal(np.signbit(got[ok]), np.signbit(ref[ok]))


def test_decode_bf16_f16_exact():
    codes = np.arange(1 << 16, dtype=np.uint32)
    for fmt, dtype in (("bf16", torch.bfloat16), ("f16", torch.float16)):
        ref = torch.from_numpy(codes.astype(np.uint16).view(np.int16)).view(dtype).float().numpy()
        got = N.decode(fmt, codes)
        ok = ~np.isnan(ref)
        assert np.array_equal(np.isnan(got), np.isnan(ref)) and np.array_equal(got[ok], ref[ok])


# ------------------------------------------------------------------------------------- encode

@pytest.mark.parametrize("fmt", list(N.ALL_FORMATS))
def test_roundtrip_every_code(fmt):
    codes = np.arange(1 << N.WIDTH[fmt], dtype=np.uint32)
    vals = N.decode(fmt, codes)
    back = N.encode(fmt, vals, saturate=False)
    ok = ~np.isnan(vals)
    assert np.array_equal(back[ok], codes[ok])
    assert np.isnan(N.decode(fmt, back[~ok])).all() or fmt in ("fp6_e2m3", "bf6_e3m2", "fp4_e2m1")


@pytest.mark.parametrize("fmt,dtype,sat", [("bf8_e5m2", torch.float8_e5m2, False), ("bf16", torch.bfloat16, False),
                                           ("f16", torch.float16, False),
                                           # torch's float8_e4m3fn cast saturates finite overflow and +-inf
                                           ("fp8_e4m3", torch.float8_e4m3fn, True)])
def test_encode_matches_torch(fmt, dtype, sat):
    x = np.concatenate([_wide_sample(), RNG.standard_normal(20000).astype(np.float32) * np.float32(300)])
    got = N.encode(fmt, x, saturate=sat)
    ref = _torch_codes(x, dtype)
    nan = np.isnan(x)
    assert np.array_equal(got[~nan], ref[~nan])
    assert np.isnan(N.decode(fmt, got[nan])).all()


def test_encode_e8m0_matches_torch():
    x = np.abs(_wide_sample())
    # torch rounds f32 subnormal inputs differently (bitwise); no gfx950 instruction encodes E8M0 anyway
    x = x[np.isfinite(x) & (x >= np.float32(2.0**-126))]
    assert np.array_equal(N.encode("e8m0", x, saturate=False), _torch_codes(x, torch.float8_e8m0fnu))


@settings(max_examples=300, deadline=None)
@given(st.lists(f32s, min_size=1, max_size=8), st.sampled_from(["fp8_e4m3", "bf8_e5m2", "fp6_e2m3", "bf6_e3m2",
                                                                  "fp4_e2m1", "bf16", "f16"]))
def test_encode_is_nearest(values, fmt):
    """RNE: the chosen code is a nearest representable value, ties to an even mantissa."""
    x = np.float32(values)
    fin = np.isfinite(x) & (np.abs(x.astype(np.float64)) <= N.max_finite(fmt))
    if not fin.any():
        return
    x = x[fin]
    got = N.decode64(fmt, N.encode(fmt, x, saturate=True))
    grid = N.decode64(fmt, np.arange(1 << N.WIDTH[fmt]))
    grid = np.unique(grid[np.isfinite(grid)])
    dist = np.abs(grid[None, :] - x.astype(np.float64)[:, None]).min(axis=1)
    assert np.array_equal(np.abs(got - x.astype(np.float64)), dist)


def test_special_values_policy():
    x = np.float32([np.inf, -np.inf, np.nan, 1e9, -1e9])
    assert list(N.encode("fp8_e4m3", x, saturate=False)) == [0x7F, 0xFF, 0x7F, 0x7F, 0xFF]
    assert list(N.encode("fp8_e4m3", x, saturate=True)) == [0x7E, 0xFE, 0x7F, 0x7E, 0xFE]
    assert list(N.encode("bf8_e5m2", x, saturate=False)) == [0x7C, 0xFC, 0x7E, 0x7C, 0xFC]
    assert list(N.encode("bf8_e5m2", x, saturate=True)) == [0x7C, 0xFC, 0x7E, 0x7B, 0xFB]
    for fmt, mx in (("fp4_e2m1", 0x7), ("fp6_e2m3", 0x1F), ("bf6_e3m2", 0x1F)):
        sign = 1 << (N.WIDTH[fmt] - 1)
        assert list(N.encode(fmt, x, saturate=False)) == [mx, sign | mx, mx, mx, sign | mx]
    # E4M3 boundary: 464 ties to 448 (even), anything above overflows
    assert list(N.encode("fp8_e4m3", np.float32([464, 464.01]), saturate=False)) == [0x7E, 0x7F]


def test_bf16_nan_quieting_and_rne():
    bits = np.uint32([0x7F800001, 0xFF812345, 0x3F808000, 0x3F818000, 0x3F808001, 0x7F7FFFFF])
    got = N.encode("bf16", bits.view(np.float32), saturate=False)
    assert list(got) == [0x7FC0, 0xFFC1, 0x3F80, 0x3F82, 0x3F81, 0x7F80]


# ------------------------------------------------------------------------------------- instructions

def lanes(x, dtype=np.float32):
    return np.resize(np.asarray(x, dtype=dtype), 64).view(np.uint32) if dtype != np.uint32 else np.resize(
        np.asarray(x, dtype=np.uint32), 64)


def f32_scale(e8m0):
    return lanes(np.uint32(e8m0) << 23, np.uint32)


def test_cvt_mnemonic_set_covers_brief():
    need = {"v_cvt_pk_fp8_f32", "v_cvt_pk_bf8_f32", "v_cvt_sr_fp8_f32", "v_cvt_sr_bf8_f32", "v_cvt_f32_fp8",
            "v_cvt_f32_bf8", "v_cvt_pk_f32_fp8", "v_cvt_pk_f32_bf8", "v_cvt_scalef32_pk_fp8_f32",
            "v_cvt_scalef32_pk_bf8_f32", "v_cvt_scalef32_pk_fp4_f32", "v_cvt_scalef32_pk_f32_fp8",
            "v_cvt_scalef32_pk_f32_bf8", "v_cvt_scalef32_pk_f32_fp4", "v_cvt_scalef32_f32_fp8",
            "v_cvt_scalef32_f32_bf8", "v_cvt_scalef32_pk_bf16_fp8", "v_cvt_scalef32_pk_bf16_fp4",
            "v_cvt_scalef32_pk_f16_fp8", "v_cvt_scalef32_pk_f16_fp4", "v_cvt_pk_bf16_f32",
            "v_cvt_scalef32_pk32_f32_fp6", "v_cvt_scalef32_pk32_fp6_f16", "v_cvt_scalef32_pk32_bf6_bf16"}
    assert need <= N.CVT_MNEMONICS
    for m in N.CVT_MNEMONICS:
        assert m in N.CVT_DST_DWORDS and m in N.CVT_SRC_DWORDS


def test_cvt_pk_bf16_f32():
    a = RNG.standard_normal(64).astype(np.float32)
    b = RNG.standard_normal(64).astype(np.float32)
    out = N.execute_cvt("v_cvt_pk_bf16_f32", [a.view(np.uint32), b.view(np.uint32)], np.zeros(64, np.uint32), {})
    ref_lo = _torch_codes(a, torch.bfloat16)
    ref_hi = _torch_codes(b, torch.bfloat16)
    assert np.array_equal(out, ref_lo | (ref_hi << 16))
    neg = N.execute_cvt("v_cvt_pk_bf16_f32", [a.view(np.uint32), b.view(np.uint32)], None, {"neg": [1, 0]})
    assert np.array_equal(neg & 0xFFFF, ref_lo ^ 0x8000)


@pytest.mark.parametrize("fmt,m", [("fp8_e4m3", "fp8"), ("bf8_e5m2", "bf8")])
def test_cvt_pk_f8_f32_half_select(fmt, m):
    a = RNG.standard_normal(64).astype(np.float32) * 10
    b = RNG.standard_normal(64).astype(np.float32) * 10
    old = lanes(0xDEADBEEF, np.uint32)
    pair = N.encode(fmt, a, saturate=False) | (N.encode(fmt, b, saturate=False) << 8)
    lo = N.execute_cvt(f"v_cvt_pk_{m}_f32", [a.view(np.uint32), b.view(np.uint32)], old, {"op_sel": [0, 0, 0]})
    hi = N.execute_cvt(f"v_cvt_pk_{m}_f32", [a.view(np.uint32), b.view(np.uint32)], old, {"op_sel": [0, 0, 1]})
    raw = N.execute_cvt(f"v_cvt_pk_{m}_f32", [a.view(np.uint32), b.view(np.uint32)], old, {"op_sel": [0, 0, 0, 1]})
    assert np.array_equal(lo, (old & 0xFFFF0000) | pair)
    assert np.array_equal(hi, (old & 0xFFFF) | (pair << 16))
    assert np.array_equal(raw, hi)


def test_cvt_f32_fp8_byte_select_and_pk():
    codes = RNG.integers(0, 256, (64, 4)).astype(np.uint32)
    word = codes[:, 0] | codes[:, 1] << 8 | codes[:, 2] << 16 | codes[:, 3] << 24
    for byte in range(4):
        got = N.execute_cvt("v_cvt_f32_fp8", [word], None, {"src0_sel": f"BYTE_{byte}"})
        ref = N.decode("fp8_e4m3", codes[:, byte])
        assert np.array_equal(got.view(np.float32), ref, equal_nan=True)
    got = N.execute_cvt("v_cvt_pk_f32_bf8", [word], None, {"src0_sel": "WORD_1"})
    assert got.shape == (2, 64)
    assert np.array_equal(got.view(np.float32), N.decode("bf8_e5m2", codes[:, 2:4].T), equal_nan=True)


@pytest.mark.parametrize("m,fmt", [("fp8", "fp8_e4m3"), ("bf8", "bf8_e5m2")])
def test_cvt_scalef32_pk_f8_f32_divides_by_scale(m, fmt):
    a = RNG.standard_normal(64).astype(np.float32) * 1000
    b = RNG.standard_normal(64).astype(np.float32) * 1000
    e = 127 + 5                                              # scale 32: results are x / 32
    old = lanes(0x11223344, np.uint32)
    out = N.execute_cvt(f"v_cvt_scalef32_pk_{m}_f32", [a.view(np.uint32), b.view(np.uint32), f32_scale(e)], old,
                        {"op_sel": [0, 0, 0, 1]})
    pair = N.encode(fmt, a / 32, saturate=False) | (N.encode(fmt, b / 32, saturate=False) << 8)
    assert np.array_equal(out, (old & 0xFFFF) | (pair << 16))
    # the scale's mantissa and sign are ignored: only its exponent field counts
    odd = f32_scale(e) | np.uint32(0x80000000 | 0x12345)
    out2 = N.execute_cvt(f"v_cvt_scalef32_pk_{m}_f32", [a.view(np.uint32), b.view(np.uint32), odd], old,
                         {"op_sel": [0, 0, 0, 1]})
    assert np.array_equal(out, out2)


def test_scalef32_overflow_and_nan_scale():
    big = lanes(1000.0)
    one = lanes(1.0)
    out = N.execute_cvt("v_cvt_scalef32_pk_fp8_f32", [big, one, f32_scale(127)], None, {})
    assert np.all(out & 0xFF == 0x7F) and np.all((out >> 8) & 0xFF == 0x38)   # 1000 -> NaN, 1.0 -> 0x38
    out = N.execute_cvt("v_cvt_scalef32_pk_fp4_f32", [big, one, f32_scale(127)], None, {})
    assert np.all(out & 0xFF == 0x27)                                            # 6.0 saturated, 1.0 = 0x2
    out = N.execute_cvt("v_cvt_scalef32_pk_fp8_f32", [one, one, f32_scale(255)], None, {})
    assert np.all(out & 0xFFFF == 0x7F7F)                                        # NaN scale -> NaN
    out = N.execute_cvt("v_cvt_scalef32_f32_fp8", [lanes(0x38, np.uint32), f32_scale(255)], None, {})
    assert np.isnan(out.view(np.float32)).all()


def test_cvt_scalef32_pk_fp4_f32_byte_select():
    a = RNG.uniform(-8, 8, 64).astype(np.float32)
    b = RNG.uniform(-8, 8, 64).astype(np.float32)
    old = lanes(0xA5A5A5A5, np.uint32)
    byte = N.encode("fp4_e2m1", a / 2, saturate=True) | (N.encode("fp4_e2m1", b / 2, saturate=True) << 4)
    for sel in range(4):
        ops = [0, 0, sel & 1, sel >> 1]
        out = N.execute_cvt("v_cvt_scalef32_pk_fp4_f32", [a.view(np.uint32), b.view(np.uint32), f32_scale(128)],
                            old, {"op_sel": ops})
        mask = np.uint32(0xFF << (8 * sel))
        assert np.array_equal(out, (old & ~mask) | (byte << np.uint32(8 * sel)))


@pytest.mark.parametrize("out", ["f32", "f16", "bf16"])
def test_cvt_scalef32_pk_up_fp4_and_fp8(out):
    word = RNG.integers(0, 2**32, 64, dtype=np.uint64).astype(np.uint32)
    scale = f32_scale(127 - 3)                             # multiply by 1/8
    wide = {"f32": np.float32, "f16": np.float16}
    for sel in range(4):
        got = N.execute_cvt(f"v_cvt_scalef32_pk_{out}_fp4", [word, scale], None, {"op_sel": [sel & 1, sel >> 1, 0]})
        byte = (word >> np.uint32(8 * sel)) & 0xFF
        ref = np.stack([N.decode64("fp4_e2m1", byte & 0xF), N.decode64("fp4_e2m1", byte >> 4)]) / 8
        _check_up(got, ref, out, wide)
    for half in range(2):
        got = N.execute_cvt(f"v_cvt_scalef32_pk_{out}_fp8", [word, scale], None, {"op_sel": [half, 0, 0]})
        w = (word >> np.uint32(16 * half)) & 0xFFFF
        ref = np.stack([N.decode64("fp8_e4m3", w & 0xFF), N.decode64("fp8_e4m3", w >> 8)]) / 8
        _check_up(got, ref, out, wide)


@pytest.mark.parametrize("m", ["fp8", "bf8"])
@pytest.mark.parametrize("out", ["f16", "bf16"])
def test_cvt_scalef32_pk_up_f8_table_equals_the_exact_path(m, out):
    """One scale exponent in every lane takes the 65536-entry table; a second exponent in one lane takes the
    exact path: the same bits for every source half, at scales from 2^-127 to NaN, with and without clamp."""
    mnemonic = f"v_cvt_scalef32_pk_{out}_{m}"
    halves = np.arange(1 << 16, dtype=np.uint32).reshape(-1, 64)
    word = halves << np.uint32(16)                        # op_sel[0] = 1: the high half
    for e in (0, 1, 120, 127, 131, 254, 255):
        for clamp in (0, 1):
            mods = {"op_sel": [1, 0, 0], "clamp": clamp}
            scale = np.full(word.shape, e << 23, np.uint32)
            table = N.execute_cvt(mnemonic, [word, scale], None, dict(mods))
            mixed = np.concatenate([scale, np.full((1, 64), (e ^ 1) << 23, np.uint32)])
            exact = N.execute_cvt(mnemonic, [np.concatenate([word, word[:1]]), mixed], None, dict(mods))
            np.testing.assert_array_equal(table, exact[:-1])
    assert table.shape == word.shape


def _check_up(got, ref, out, wide):
    if out == "f32":
        assert got.shape == (2, 64)
        vals = got.view(np.float32)
    else:
        vals = np.stack([N.decode(out, got & 0xFFFF), N.decode(out, got >> 16)])
    expect = ref.astype(wide[out]).astype(np.float32) if out in wide else N.decode("bf16", N.encode("bf16", ref.astype(np.float32), saturate=False))
    assert np.array_equal(vals, expect, equal_nan=True)


def test_cvt_scalef32_single_f32_and_f16_byte_select():
    word = RNG.integers(0, 2**32, 64, dtype=np.uint64).astype(np.uint32)
    old = lanes(0xCAFEBABE, np.uint32)
    for sel in range(4):
        b = (word >> np.uint32(8 * sel)) & 0xFF
        got = N.execute_cvt("v_cvt_scalef32_f32_bf8", [word, f32_scale(130)], old, {"op_sel": [sel & 1, sel >> 1, 0]})
        assert np.array_equal(got.view(np.float32), (N.decode64("bf8_e5m2", b) * 8).astype(np.float32), equal_nan=True)
        got = N.execute_cvt("v_cvt_scalef32_f16_fp8", [word, f32_scale(127)], old, {"op_sel": [sel & 1, sel >> 1, 1]})
        ref = N.encode("f16", N.decode("fp8_e4m3", b), saturate=False)
        assert np.array_equal(got & 0xFFFF, old & 0xFFFF)
        assert np.array_equal(got >> 16, ref)


def test_cvt_sr_fp8_f32():
    x = RNG.uniform(-100, 100, 64).astype(np.float32)
    old = lanes(0x01020304, np.uint32)
    zero = N.execute_cvt("v_cvt_sr_fp8_f32", [x.view(np.uint32), lanes(0, np.uint32)], old, {"op_sel": [0, 0, 1, 1]})
    trunc = np.sign(x) * N.decode64("fp8_e4m3", N.encode("fp8_e4m3", x, saturate=False) & 0x7F)
    got = N.decode64("fp8_e4m3", zero >> 24)
    assert np.array_equal(zero & 0xFFFFFF, old & 0xFFFFFF)
    assert np.all(np.abs(got) <= np.abs(x)) and np.all(np.abs(trunc - x) >= 0)   # seed 0 truncates
    full = N.execute_cvt("v_cvt_sr_fp8_f32", [x.view(np.uint32), lanes(0xFFFFFFFF, np.uint32)], old,
                         {"op_sel": [0, 0, 0, 0]})
    up = N.decode64("fp8_e4m3", full & 0xFF)
    exact = N.decode64("fp8_e4m3", N.encode("fp8_e4m3", x, saturate=False)) == x
    assert np.all((np.abs(up) >= np.abs(x)) | exact)                          # max seed rounds away from zero


@pytest.mark.parametrize("k,fmt6", [("fp6", "fp6_e2m3"), ("bf6", "bf6_e3m2")])
def test_pk32_fp6_roundtrip(k, fmt6):
    codes = RNG.integers(0, 64, (64, 32)).astype(np.uint32)
    packed = N._pack_bits(codes, 6, 6)
    assert packed.shape == (6, 64)
    # element 5 straddles dword 0 and 1 (bits 30..35)
    assert np.array_equal(((packed[0] >> 30) | ((packed[1] & 0xF) << 2)), codes[:, 5])
    vals = N.execute_cvt(f"v_cvt_scalef32_pk32_f32_{k}", [packed, f32_scale(127)], None, {})
    assert vals.shape == (32, 64)
    assert np.array_equal(vals.view(np.float32), N.decode(fmt6, codes).T)
    bf = N.execute_cvt(f"v_cvt_scalef32_pk32_bf16_{k}", [packed, f32_scale(127)], None, {})
    assert bf.shape == (16, 64)
    halves = np.stack([bf & 0xFFFF, bf >> 16], axis=1).reshape(32, 64).T
    back = N.execute_cvt(f"v_cvt_scalef32_pk32_{k}_bf16", [bf, f32_scale(127)], None, {})
    assert np.array_equal(N.decode("bf16", halves), N.decode(fmt6, codes))
    assert np.array_equal(back, packed) or np.array_equal(N.decode(fmt6, N._unpack_bits(back, 6, 32)),
                                                          N.decode(fmt6, codes))


def test_2xpk16_fp6_f32_order():
    v0 = RNG.integers(-7, 8, (16, 64)).astype(np.float32)
    v1 = RNG.integers(-7, 8, (16, 64)).astype(np.float32)
    out = N.execute_cvt("v_cvt_scalef32_2xpk16_fp6_f32", [v0.view(np.uint32), v1.view(np.uint32), f32_scale(127)],
                        None, {})
    got = N.decode("fp6_e2m3", N._unpack_bits(out, 6, 32))
    assert np.array_equal(got[:, 0::2], v0.T) and np.array_equal(got[:, 1::2], v1.T)


def test_unknown_cvt_raises():
    with pytest.raises(NotImplementedError):
        N.execute_cvt("v_cvt_nonexistent", [lanes(0, np.uint32)], None, {})
