"""The routed entry's MoE launches: quant_sort, gate-up, and down with the combine folded in (down.py,
combine=True): three launches instead of four, the same bits (tickets decide who sums, not the sum's order).

The tickets are int32 [M, h/64, 4] (token, down column block, 16-column quarter), zeroed in the same
allocation as the sort's meta (one memset, as before)."""

import flydsl.compiler as flyc
import flydsl.expr as fx
import torch

from amd_kernels.moe import prepare
from amd_kernels.moe.mxfp4_moe import down


def make(geo, k_quant_sort, gate_ups, workspace, weight_shapes):
    """{key: (launcher, example_args)} for "fused.full" (and "fused.small_m" when gate_ups has it), and their
    launch_args(key, x, topk_weights, topk_ids, w, out, device)."""
    k_down_combine = down.make(geo, combine=True)

    def make_launcher(small_m):
        @flyc.jit
        def moe_fused(x: fx.Tensor, topk_weights: fx.Tensor, topk_ids: fx.Tensor, w13: fx.Tensor,
                      w13_scale: fx.Tensor, w13_bias: fx.Tensor, w2: fx.Tensor, w2_scale: fx.Tensor,
                      w2_bias: fx.Tensor, shard: fx.Tensor, xq: fx.Tensor, xs: fx.Tensor, sorted_pairs: fx.Tensor,
                      tile_expert: fx.Tensor, meta: fx.Tensor, inter_q: fx.Tensor, inter_s: fx.Tensor, y: fx.Tensor,
                      tickets: fx.Tensor, out: fx.Tensor, m: fx.Int32, tiles: fx.Int32,
                      stream: fx.Stream = fx.Stream(None)):
            k_quant_sort(x, xq, xs, topk_ids, sorted_pairs, tile_expert, meta, m).launch(
                grid=(m + 1, 1, 1), block=(64, 1, 1), stream=stream)
            s1, waves = gate_ups[small_m]
            s1(xq, xs, sorted_pairs, tile_expert, meta, w13, w13_scale, w13_bias, shard, inter_q, inter_s,
               m).launch(grid=(tiles, geo.nb1, 1), block=(waves * 64, 1, 1), stream=stream)
            k_down_combine(inter_q, inter_s, sorted_pairs, tile_expert, meta, w2, w2_scale, w2_bias, shard,
                           topk_weights, y, topk_ids, tickets, out, m).launch(
                grid=(tiles, geo.nb2, 1), block=(64, 1, 1), stream=stream)
        return moe_fused

    launchers = {"fused.full": make_launcher(False)}
    if True in gate_ups:
        launchers["fused.small_m"] = make_launcher(True)

    def launch_args(key, x, topk_weights, topk_ids, w, out, device="cpu"):
        m = x.shape[0]
        ws, tiles, _ = workspace(m, device)  # (the super-tile count serves the prefill tier only)
        zeroed = torch.zeros(4 + m * geo.nb2 * 4, dtype=torch.int32, device=device)  # meta, then the tickets
        return (x, topk_weights, topk_ids, w["w13"], w["w13_scale"], w["w13_bias"], w["w2"], w["w2_scale"],
                w["w2_bias"], w["shard"], ws["xq"], ws["xs"], ws["sorted_pairs"], ws["tile_expert"], zeroed[:4],
                ws["inter_q"], ws["inter_s"], ws["y"], zeroed[4:], out, m, tiles)

    def example_args_of(key):
        def example_args(m: int = 1):
            w = {k: torch.empty(s, dtype=prepare.WEIGHT_DTYPES[k]) for k, s in weight_shapes().items()}
            x = torch.zeros(m, geo.hidden, dtype=torch.bfloat16)
            return launch_args(key, x, torch.zeros(m, geo.top_k), torch.zeros(m, geo.top_k, dtype=torch.int32), w,
                               torch.zeros_like(x))
        return example_args

    return {k: (v, example_args_of(k)) for k, v in launchers.items()}, launch_args
