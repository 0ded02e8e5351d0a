"""The per-shape numbers of the MoE pipeline, computed once (host side, plain Python ints)."""

import math
from dataclasses import dataclass

KSTEP = 128  # K per MFMA (16x16x128)
ROWS = 16  # sorted rows per tile
MASKED_STORE_OFFSET = 0x7FFFFFF0  # common.buffer.never_in_range(): every buffer must end below it


def super_pack(waves: int) -> int:
    """A prefill tier's super-tile table entry is first tile * super_pack(waves) + tiles (1 .. waves tiles)."""
    return 1 << waves.bit_length()


def prefill_suffix(waves: int) -> str:
    """Kernel name suffix of a prefill tier's launches (the 64-row tier's names predate the 128-row one's)."""
    return "_prefill" if waves == 4 else f"_prefill{waves * ROWS}"


def round_up(x, m):
    return -(-x // m) * m


def max_tiles(pairs: int, experts: int) -> int:
    """Upper bound of the sorted tiles for `pairs` (token, slot) pairs: each expert pads to 16 rows."""
    return pairs // ROWS + min(experts, pairs)


@dataclass(frozen=True)
class Geometry:
    hidden: int
    ip: int  # prepared (padded) intermediate columns
    experts: int
    top_k: int
    activation: str  # "gptoss" or "swiglu"
    name: str  # kernel name prefix
    small_m_waves: int  # > 0: a small-M gate-up tier with up to that many waves per workgroup
    biases: bool
    hp: int  # hidden rounded up to a K-step
    ks1: int  # gate-up K-steps (K = HP)
    ks2: int  # down K-steps (K = IP)
    kg1: int  # gate-up scale dwords per row (4 K-steps each)
    kg2: int
    ng1: int  # 16-row weight groups of w13 / w2
    ng2: int
    nb1: int  # gate-up workgroup columns (32 intermediate columns each)
    nb2: int  # down workgroup columns (64 output columns each)
    chunk: int  # gate-up K-steps per MFMA chain, in every tier (batch invariance)
    group: int  # chunks summed left to right before the group sums are
    max_tokens: int  # the entry refuses more tokens

    @classmethod
    def of(cls, hidden: int, ip: int, experts: int, top_k: int, activation: str, name: str,
           small_m_waves: int = 0) -> "Geometry":
        if hidden % 64 or ip % KSTEP or experts > 128 or experts % 2:
            raise ValueError(f"unsupported MoE shape: hidden {hidden} (multiple of 64), IP {ip} (of 128), "
                             f"experts {experts} (even, <= 128)")
        hp = round_up(hidden, KSTEP)
        ks1, ks2 = hp // KSTEP, ip // KSTEP
        # Batch invariance: every gate-up tier sums K in the same fixed grouping, so a row's bits never
        # depend on which tier its batch size picks. K-steps run in chunks of `chunk` (one MFMA chain each,
        # from zero); `group` consecutive chunks are summed left to right, then the group sums left to right.
        # A full-tier wave holds one group; a small-M wave holds fewer chunks, and wave 0 forms the groups.
        tiers = [k_steps_per_wave(ks1, 4)] + ([k_steps_per_wave(ks1, small_m_waves)] if small_m_waves else [])
        chunk = math.gcd(*tiers)
        assert len({-(-ks1 // k) * k // chunk for k in tiers}) == 1, "tiers must sum the same chunks"
        geo = dict(hidden=hidden, ip=ip, experts=experts, top_k=top_k, activation=activation, name=name,
                   small_m_waves=small_m_waves, biases=activation == "gptoss", hp=hp, ks1=ks1, ks2=ks2,
                   kg1=-(-ks1 // 4), kg2=-(-ks2 // 4), ng1=2 * ip // 16, ng2=hidden // 16, nb1=ip // 32,
                   nb2=hidden // 64, chunk=chunk, group=tiers[0] // chunk)
        # Token bound: masked stores aim just below 2 GiB and offsets are 32-bit, so every buffer must end
        # below that offset; the bound is the largest power of two that keeps them there.
        max_tokens = 1
        while largest_buffer(geo, 2 * max_tokens) < MASKED_STORE_OFFSET:
            max_tokens *= 2
        return cls(**geo, max_tokens=max_tokens)

    def k_steps_per_wave(self, max_waves: int) -> int:
        return k_steps_per_wave(self.ks1, max_waves)


def k_steps_per_wave(ks1: int, max_waves: int) -> int:
    """Gate-up K-steps per wave with at most max_waves waves: a multiple of 4, so each lane's B-scale dword
    is read by one wave."""
    ksw = 4
    while -(-ks1 // ksw) > max_waves:
        ksw += 4
    return ksw


def largest_buffer(geo: dict, m: int) -> int:
    """Bytes of the largest buffer a launch at m tokens indexes (workspace, x, out)."""
    pairs = m * geo["top_k"]
    rows = max(1, max_tiles(pairs, geo["experts"])) * ROWS
    return max(pairs * geo["hidden"] * 2, rows * geo["ip"], rows * geo["kg2"] * 16, m * geo["hp"],
               m * geo["hidden"] * 2)
