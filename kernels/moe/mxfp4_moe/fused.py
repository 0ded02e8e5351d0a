"""The routed entry's launches (the "fused.*" tiers): at decode sizes three launches for the whole MoE layer,
the router included, the same bits as the route package's launch followed by the MoE's four.

1. route_quant_sort.py: the router split over experts (E/16 workgroups per 16-token tile, each logit the
   route kernel's MFMA chain), its tile's last workgroup (by ticket) doing top-k and softmax, the last tile's
   the counting sort; the activation quantization in workgroups of their own.
2. gate_up.py (unchanged). 3. down.py with the combine folded in (combine=True: the last writer of a token's
   columns, by ticket, sums its k rows in slot order).
Tickets decide who does the work, never its order. They are int32, zeroed in one allocation with the sort's
meta: meta [4], down's [M, h/64, 4] (token, down column block, 16-column quarter), the router's
[ceil(M/16) + 1] (one per token tile, then the tiles' own).

"fused.prefill" and "fused.prefill128" (the routed entry from its prefill threshold, and from the 128-row
tier's): four launches, route_quant_sort.py's copy for that tier (the sort also writes its super-tile table)
and then the MoE prefill tier's gate-up, down and combine (the pipeline's launch_stages) instead of the
router's own launch and the tier's five: the same bits."""

import flydsl.compiler as flyc
import flydsl.expr as fx
import torch

from amd_kernels.moe import prepare
from amd_kernels.moe.mxfp4_moe import down, route_quant_sort


def make(geo, tiers, gate_ups, workspace, weight_shapes, launch_stages):
    """{key: (launcher, example_args)} for "fused.full", "fused.<tier>" for each prefill tier of `tiers`
    ({tier: waves}) (and "fused.small_m" when gate_ups has it), and their launch_args(key, x, router_weight,
    router_bias, w, out, device). launch_stages: the pipeline's launches after its sort (gate-up, down,
    combine) of a tier."""
    k_route_quant_sort = route_quant_sort.make(geo)
    k_down_combine = down.make(geo, combine=True)

    def make_launcher(small_m):
        @flyc.jit
        def moe_fused(x: fx.Tensor, router_weight: fx.Tensor, router_bias: fx.Tensor, w13: fx.Tensor,
                      w13_scale: fx.Tensor, w13_bias: fx.Tensor, w2: fx.Tensor, w2_scale: fx.Tensor,
                      w2_bias: fx.Tensor, shard: fx.Tensor, topk_weights: fx.Tensor, topk_ids: fx.Tensor,
                      keys: fx.Tensor, route_tickets: fx.Tensor, xq: fx.Tensor, xs: fx.Tensor,
                      sorted_pairs: fx.Tensor, tile_expert: fx.Tensor, meta: fx.Tensor, inter_q: fx.Tensor,
                      inter_s: fx.Tensor, y: fx.Tensor, tickets: fx.Tensor, out: fx.Tensor, m: fx.Int32,
                      tiles: fx.Int32, stream: fx.Stream = fx.Stream(None)):
            k_route_quant_sort(x, router_weight, router_bias, topk_weights, topk_ids, keys, route_tickets, xq, xs,
                               sorted_pairs, tile_expert, meta, m).launch(
                grid=(route_quant_sort.router_workgroups(m, geo.experts) + m, 1, 1), block=(64, 1, 1),
                stream=stream)
            s1, waves = gate_ups[small_m]
            s1(xq, xs, sorted_pairs, tile_expert, meta, w13, w13_scale, w13_bias, shard, inter_q, inter_s,
               m).launch(grid=(tiles, geo.nb1, 1), block=(waves * 64, 1, 1), stream=stream)
            k_down_combine(inter_q, inter_s, sorted_pairs, tile_expert, meta, w2, w2_scale, w2_bias, shard,
                           topk_weights, y, topk_ids, tickets, out, m).launch(
                grid=(tiles, geo.nb2, 1), block=(64, 1, 1), stream=stream)
        return moe_fused

    def make_prefill_launcher(tier):
        k_route_quant_sort_prefill = route_quant_sort.make(geo, tiers[tier])

        @flyc.jit
        def moe_fused_prefill(x: fx.Tensor, router_weight: fx.Tensor, router_bias: fx.Tensor, w13: fx.Tensor,
                              w13_scale: fx.Tensor, w13_bias: fx.Tensor, w2: fx.Tensor, w2_scale: fx.Tensor,
                              w2_bias: fx.Tensor, shard: fx.Tensor, topk_weights: fx.Tensor, topk_ids: fx.Tensor,
                              keys: fx.Tensor, route_tickets: fx.Tensor, xq: fx.Tensor, xs: fx.Tensor,
                              sorted_pairs: fx.Tensor, tile_expert: fx.Tensor, meta: fx.Tensor, inter_q: fx.Tensor,
                              inter_s: fx.Tensor, y: fx.Tensor, out: fx.Tensor, m: fx.Int32, supers: fx.Int32,
                              stream: fx.Stream = fx.Stream(None)):
            k_route_quant_sort_prefill(x, router_weight, router_bias, topk_weights, topk_ids, keys, route_tickets,
                                       xq, xs, sorted_pairs, tile_expert, meta, m).launch(
                grid=(route_quant_sort.router_workgroups(m, geo.experts) + m, 1, 1), block=(64, 1, 1),
                stream=stream)
            launch_stages(tier, topk_weights, topk_ids, w13, w13_scale, w13_bias, w2, w2_scale, w2_bias, shard,
                          xq, xs, sorted_pairs, tile_expert, meta, inter_q, inter_s, y, out, m, supers, stream)
        return moe_fused_prefill

    launchers = {"fused.full": make_launcher(False), **{f"fused.{t}": make_prefill_launcher(t) for t in tiers}}
    if True in gate_ups:
        launchers["fused.small_m"] = make_launcher(True)

    def launch_args(key, x, router_weight, router_bias, w, out, device="cpu"):
        m = x.shape[0]
        ws, tiles, supers_of = workspace(m, device)
        route_tiles = -(-m // route_quant_sort.TILE_M)
        routing = dict(dtype=torch.float32, device=device), dict(dtype=torch.int32, device=device)
        route_io = (torch.empty((m, geo.top_k), **routing[0]), torch.empty((m, geo.top_k), **routing[1]),
                    torch.empty(route_tiles * route_quant_sort.TILE_M * geo.experts, **routing[1]))
        weights = (w["w13"], w["w13_scale"], w["w13_bias"], w["w2"], w["w2_scale"], w["w2_bias"], w["shard"])
        tier = key.split(".")[1]
        if tier in tiers:
            supers = supers_of[tier]
            # meta with the super-tile table and the router's tickets: one memset
            zeroed = torch.zeros(4 + supers + route_tiles + 1, dtype=torch.int32, device=device)
            return (x, router_weight, router_bias, *weights, *route_io, zeroed[4 + supers:], ws["xq"], ws["xs"],
                    ws["sorted_pairs"], ws["tile_expert"], zeroed[:4 + supers], ws["inter_q"], ws["inter_s"],
                    ws["y"], out, m, supers)
        down_tickets = m * geo.nb2 * 4
        # meta, down's tickets, the router's: one memset
        zeroed = torch.zeros(4 + down_tickets + route_tiles + 1, dtype=torch.int32, device=device)
        return (x, router_weight, router_bias, *weights, *route_io, zeroed[4 + down_tickets:], ws["xq"], ws["xs"],
                ws["sorted_pairs"], ws["tile_expert"], zeroed[:4], ws["inter_q"], ws["inter_s"], ws["y"],
                zeroed[4:4 + down_tickets], out, m, tiles)

    def example_args_of(key):
        def example_args(m: int = 1):
            w = {k: torch.empty(s, dtype=prepare.WEIGHT_DTYPES[k]) for k, s in weight_shapes().items()}
            x = torch.zeros(m, geo.hidden, dtype=torch.bfloat16)
            return launch_args(key, x, torch.zeros(geo.experts, geo.hidden, dtype=torch.bfloat16),
                               torch.zeros(geo.experts, dtype=torch.bfloat16), w, torch.zeros_like(x))
        return example_args

    return {k: (v, example_args_of(k)) for k, v in launchers.items()}, launch_args
