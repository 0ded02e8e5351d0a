"""MXFP8-activation x MXFP4-weight MoE: four FlyDSL launches (three in the routed entry), built per shape
(h, IP, E, top-k, activation).

One file per launch; `build()` below puts them together with the host side (variant choice, workspace,
launch arguments). The per-shape numbers are computed once in geometry.py; common.py holds the device
helpers the launches share, among them the tile prologue of the two tile launches and the A-scale byte
position.

1. quant_sort.py  grid M + 1: workgroups 0 .. M-1 quantize x bf16 [M, h] -> xq E4M3 [M, HP] + E8M0 scales
               [M, KG1*16] in the A-scale layout (byte (4j + q)*4 + b of a row = K-block 4(4j + b) + q: one
               dword per lane per 4 K-steps), a row each; workgroup M runs the deterministic counting sort of
               the M*k (token, slot) pairs by expert into 16-row tiles (sorted_pairs, -1 in padding rows;
               tile_expert; the tile count in meta). Garbage ids (outside [0, E)) are dropped. The two are
               independent, so they share one launch (one launch gap fewer at decode).
2. gate_up.py  grid (max_tiles, IP/32): 16 sorted rows x 32 intermediate columns (gate 32 + up 32 weight rows)
               of one expert, K split over the workgroup's waves and summed through LDS in one fixed grouping
               in every variant (batch invariance: a row's bits never depend on the tier its batch size
               picks); + bias, the activation (NaN kept), MXFP8 per row over the 32 columns -> inter. Up to 4
               waves; the small-M variant ("moe.small_m", while the grid is < 256 workgroups) uses up to 8.
3. down.py     grid (max_tiles, h/64): one wave x 4 groups of 16 output columns, K = IP, + bias, times the
               pair's routing weight -> y bf16 [M*k, h] at row pair = token*k + slot (one writer per element).
4. combine.py  grid M: out[m] = sum over j = 0..k-1 of y[m*k + j] in that order (fp32), -> bf16.
Prefill tiers ("moe.prefill" from the package's prefill_from tokens, "moe.prefill128" from its
prefill128_from): launches 2 and 3 are prefill.py's instead, over super-tiles of up to 4 (8) 16-row tiles of
one expert (64 (128) rows, one wave each) whose weight rows are staged once per workgroup through LDS; a
row's K sums are bitwise those of the 16-row tiers (same MFMAs, same grouping). The tier's sort launch also
writes its super-tile table (meta); its grid is prefill.max_supers.
Tiles past the sorted count exit at once (max_tiles is a host bound; the real count is read on device).
No atomics anywhere (LDS counters are updated by one lane per expert per chunk, in program order).
M is at most `max_tokens` (the entry refuses more): every buffer then ends below the masked-store offset
buffer.never_in_range() and 32-bit offsets cannot wrap.

Bytes that carry nothing are not read: `shard` (from prepare_weights) gives the live intermediate columns
[live_lo, live_hi) of the prepared span, and whether the w2 bias is added (rank 0); weight rows of dead
columns, dead 32-column K-blocks of w2, the K tail past h in the last gate-up K-step and zero biases load
out of range (0, no memory traffic). The swiglu activation has no biases at all.
The emulator's sampling hook is in sampling.py.

The routed entry (the package's router weights and the hidden states in) runs fused.py's launchers below the
prefill tier: three launches for the MoE layer, the router included. route_quant_sort.py replaces launch 1:
the router split over expert blocks (route.py's logits, bit for bit), its tiles' top-k and softmax and then
the sort done by the last workgroups by ticket, the quantization rows beside; then gate-up; then down with 4
folded in (down.py with combine=True: the last writer of a token's columns sums them).
"""

from types import SimpleNamespace

import flydsl.compiler as flyc
import flydsl.expr as fx
import torch

from amd_kernels.moe import prepare
from amd_kernels.moe.mxfp4_moe import combine, down, fused, gate_up, prefill, quant_sort, route_quant_sort, sampling
from amd_kernels.moe.mxfp4_moe.geometry import ROWS, Geometry, max_tiles


def build(hidden: int, ip: int, experts: int, top_k: int, activation: str, name: str, small_m_waves: int = 0,
          prefill_from: int = 0, prefill128_from: int = 0):
    """The pipeline for one shape. small_m_waves > 0 adds a variant for small token counts whose gate-up
    splits K over up to that many waves per workgroup. prefill_from > 0: the token count from which the
    entry picks the prefill tier of 64-row super-tiles, prefill128_from > 0 the one of 128-row super-tiles (per
    shape, where the cost model projects them faster); 0: the tier is built and warmed up but never picked
    (callers may still launch it by key). variant_for checks prefill128_from first, so it also overrides a
    caller's lower threshold (the routed entry's): from prefill128_from tokens both entries take the 128-row
    tier."""
    for arg, v in (("prefill_from", prefill_from), ("prefill128_from", prefill128_from)):
        if not isinstance(v, int) or v < 0:
            raise ValueError(f"{arg}: a token count >= 0 (0: never), got {v!r}")
    geo = Geometry.of(hidden, ip, experts, top_k, activation, name, small_m_waves)
    k_quant_sort = quant_sort.make(geo)
    gate_ups = {False: gate_up.make(geo, 4, f"{name}_gate_up")}
    if small_m_waves:
        gate_ups[True] = gate_up.make(geo, small_m_waves, f"{name}_gate_up_small_m")
    k_stage2, k_combine = down.make(geo), combine.make(geo)
    # The prefill tiers (prefill.py), by key: their sort (which also writes the super-tile table), gate-up
    # (in gate_ups) and down
    tier_waves = {"prefill": 4, "prefill128": 8}
    sorts, downs = {}, {}
    for tier, waves in tier_waves.items():
        sorts[tier] = quant_sort.make(geo, waves)
        gate_ups[tier], downs[tier] = prefill.make_gate_up(geo, waves), prefill.make_down(geo, waves)

    def launch_all(small_m, x, topk_weights, topk_ids, w13, w13_scale, w13_bias, w2, w2_scale, w2_bias, shard,
                   xq, xs, sorted_pairs, tile_expert, meta, inter_q, inter_s, y, out, m, tiles, stream):
        sorts.get(small_m, k_quant_sort)(
            x, xq, xs, topk_ids, sorted_pairs, tile_expert, meta, m).launch(
            grid=(m + 1, 1, 1), block=(64, 1, 1), stream=stream)
        launch_stages(small_m, topk_weights, topk_ids, w13, w13_scale, w13_bias, w2, w2_scale, w2_bias, shard,
                      xq, xs, sorted_pairs, tile_expert, meta, inter_q, inter_s, y, out, m, tiles, stream)

    def launch_stages(small_m, topk_weights, topk_ids, w13, w13_scale, w13_bias, w2, w2_scale, w2_bias, shard,
                      xq, xs, sorted_pairs, tile_expert, meta, inter_q, inter_s, y, out, m, tiles, stream):
        """Launches 2-4 (gate-up, down, combine) after a sort; also the routed entry's prefill tier (fused.py)."""
        s1, waves = gate_ups[small_m]
        s1(xq, xs, sorted_pairs, tile_expert, meta, w13, w13_scale, w13_bias, shard, inter_q, inter_s, m).launch(
            grid=(tiles, geo.nb1 // (prefill.gu_blocks(geo) if small_m in downs else 1), 1),
            block=(waves * 64, 1, 1), stream=stream)
        if small_m in downs:
            downs[small_m](inter_q, inter_s, sorted_pairs, tile_expert, meta, w2, w2_scale, w2_bias, shard,
                           topk_weights, y, m).launch(grid=(tiles, geo.nb2 // prefill.down_blocks(geo), 1),
                                                      block=(waves * 64, 1, 1), stream=stream)
        else:
            k_stage2(inter_q, inter_s, sorted_pairs, tile_expert, meta, w2, w2_scale, w2_bias, shard, topk_weights,
                     y, m).launch(grid=(tiles, geo.nb2, 1), block=(64, 1, 1), stream=stream)
        k_combine(y, topk_ids, out, m).launch(grid=(m, 1, 1), block=(64, 1, 1), stream=stream)

    def make_launcher(small_m):
        @flyc.jit
        def moe(x: fx.Tensor, topk_weights: fx.Tensor, topk_ids: fx.Tensor, w13: fx.Tensor, w13_scale: fx.Tensor,
                w13_bias: fx.Tensor, w2: fx.Tensor, w2_scale: fx.Tensor, w2_bias: fx.Tensor, shard: fx.Tensor,
                xq: fx.Tensor, xs: fx.Tensor, sorted_pairs: fx.Tensor, tile_expert: fx.Tensor, meta: fx.Tensor,
                inter_q: fx.Tensor, inter_s: fx.Tensor, y: fx.Tensor, out: fx.Tensor, m: fx.Int32,
                tiles: fx.Int32, stream: fx.Stream = fx.Stream(None)):
            launch_all(small_m, x, topk_weights, topk_ids, w13, w13_scale, w13_bias, w2, w2_scale, w2_bias, shard,
                       xq, xs, sorted_pairs, tile_expert, meta, inter_q, inter_s, y, out, m, tiles, stream)
        return moe

    launchers = {"moe.full": make_launcher(False), **{f"moe.{t}": make_launcher(t) for t in tier_waves}}
    if small_m_waves:
        launchers["moe.small_m"] = make_launcher(True)

    def variant_for(m: int, from_tokens: int | None = None) -> str:
        """The 128-row prefill tier from prefill128_from tokens, the 64-row one from `from_tokens` tokens
        (default prefill_from; 0: never); below, the many-wave gate-up while the plain one would launch fewer
        than 256 workgroups."""
        start = prefill_from if from_tokens is None else from_tokens
        if prefill128_from and m >= prefill128_from:
            return "moe.prefill128"
        if start and m >= start:
            return "moe.prefill"
        return "moe.small_m" if small_m_waves and max_tiles(m * top_k, experts) * geo.nb1 < 256 else "moe.full"

    def workspace(m: int, device="cpu"):
        pairs = m * top_k
        tiles = max(1, max_tiles(pairs, experts))
        rows = tiles * ROWS
        supers = {t: max(1, prefill.max_supers(pairs, experts, w)) for t, w in tier_waves.items()}
        u8 = dict(dtype=torch.uint8, device=device)
        i32 = dict(dtype=torch.int32, device=device)
        return dict(xq=torch.empty(m, geo.hp, **u8), xs=torch.empty(m, geo.kg1 * 16, **u8),
                    sorted_pairs=torch.empty(rows, **i32), tile_expert=torch.empty(tiles, **i32),
                    # meta: [0] the tile count; [1] and [4:] the prefill tier's super-tiles (prefill.py)
                    meta=torch.zeros(4 + max(supers.values()), **i32), inter_q=torch.empty(rows, ip, **u8),
                    inter_s=torch.empty(rows, geo.kg2 * 16, **u8),
                    y=torch.empty(max(pairs, 1), hidden, dtype=torch.bfloat16, device=device)), tiles, supers

    def weight_shapes():
        return dict(w13=(experts, geo.ng1, geo.ks1, 64, 16), w13_scale=(experts, geo.ng1, geo.kg1, 64, 4),
                    w13_bias=(experts, 2 * ip), w2=(experts, geo.ng2, geo.ks2, 64, 16),
                    w2_scale=(experts, geo.ng2, geo.kg2, 64, 4), w2_bias=(experts, hidden), shard=(4,))

    def launch_args(key, x, topk_weights, topk_ids, w, out, device="cpu"):
        """The launcher's positional arguments (without the stream) for variant `key`."""
        m = x.shape[0]
        ws, tiles, supers = workspace(m, device)
        return (x, topk_weights, topk_ids, w["w13"], w["w13_scale"], w["w13_bias"], w["w2"], w["w2_scale"],
                w["w2_bias"], w["shard"], ws["xq"], ws["xs"], ws["sorted_pairs"], ws["tile_expert"], ws["meta"],
                ws["inter_q"], ws["inter_s"], ws["y"], out, m, supers.get(key.split(".")[1], tiles))

    def example_args_of(key):
        def example_args(m: int = 1):
            # empty, not zeros: a compile reads shapes only, and zeroed weights are 1.7 GB of touched pages
            w = {k: torch.empty(s, dtype=prepare.WEIGHT_DTYPES[k]) for k, s in weight_shapes().items()}
            x = torch.zeros(m, hidden, dtype=torch.bfloat16)
            return launch_args(key, x, torch.zeros(m, top_k), torch.zeros(m, top_k, dtype=torch.int32), w,
                               torch.zeros_like(x))
        return example_args

    # The routed entry's launches (fused.py): the router, quant and sort in one; at decode sizes the combine
    # folded into down. A shape the router launch cannot split (route_quant_sort.routable) has none: its
    # routed entry runs the router's own launch, then the MoE's.
    fused_variants, fused_launch_args = {}, None
    if route_quant_sort.routable(geo):
        fused_variants, fused_launch_args = fused.make(geo, tier_waves, gate_ups, workspace, weight_shapes,
                                                         launch_stages)

    return SimpleNamespace(variants={k: (v, example_args_of(k)) for k, v in launchers.items()},
                           fused_variants=fused_variants, fused_launch_args=fused_launch_args,
                           variant_for=variant_for, max_tokens=geo.max_tokens, launch_args=launch_args,
                           weight_shapes=weight_shapes, weight_dtypes=prepare.WEIGHT_DTYPES,
                           emulator_workgroups=sampling.make(geo), geometry=geo, prefill_from=prefill_from)
