"""The fewest bytes a staged MoE issues for a given workgroup tile, when nothing is cached: what a kernel's
tile shape can reach on the issued-bytes counter (issue 15's prefill target), before writing the kernel.

    python -m benchmarks.moe.tile_bound            # the three MoE shapes, 256 to 8192 tokens, several tiles

A gate-up workgroup computes `gu_rows` sorted rows of one expert x `gu_cols` weight rows (gate and up
interleaved) over the whole K; a down workgroup `down_rows` x `down_cols` output columns. Each loads its
operands once: an expert's weights once per tile of its rows (ceil(n_e / rows) times), its rows' MXFP8
activations once per column block (rows padded to 16). Plus the stage boundaries written and read once (the
quantized x, the MXFP8 intermediate, the bf16 per-pair rows, the output). Divided by moe_cost's minimum,
with the routing the runner uses (moe_cost.routing, seed 0).

The tiles the prefill tiers run: (64, 256, 64, 320) is moe.prefill at TP1 (gu_blocks 4, down_blocks 5), (128,
256, 128, 320) moe.prefill128 (h6144's blocks: gate-up 192, down 256 columns). The bound is below the
emulator's issued bytes of those tiers by 1-5 % at TP1 and 5-12 % at TP8 and h6144 (256-8192 tokens, the
package README tables): it leaves out scale re-reads, padding and the sort's own traffic. A tile's
accumulators must fit one CU's registers: 4 SIMDs x 512 registers x 64 lanes x 4 bytes = 512 KB, i.e. gu_rows
x gu_cols <= 131072 fp32 before any operand or chain register (the batch-invariant K grouping holds 2-3
accumulator sets)."""

from __future__ import annotations

import argparse
import math

import torch

from benchmarks.moe.moe_cost import expert_bytes, moe_cost, routing
from references.moe import shard_columns

SHAPES = {  # name: (hidden, intermediate, tp_size, biases)
    "TP1 h2880 i2880": (2880, 2880, 1, True),
    "TP8 h2880 i2880 (rank 0)": (2880, 2880, 8, True),
    "h6144 i768": (6144, 768, 1, False),
}
TILES = [(64, 256, 64, 320), (128, 256, 128, 320), (128, 512, 128, 640), (256, 256, 256, 320),
         (256, 512, 256, 640)]


def issued_x_min(m: int, hidden: int, inter: int, experts: int, top_k: int, tp_size: int, biases: bool,
                 gu_rows: int, gu_cols: int, down_rows: int, down_cols: int) -> float:
    """Issued bytes / moe_cost's minimum for tiles (gu_rows x gu_cols, down_rows x down_cols)."""
    start, end = shard_columns(inter, tp_size, 0)
    per = end - start
    w13, w2 = expert_bytes(hidden, per, biases=biases)
    hp = -(-hidden // 128) * 128
    a1, a2 = hp + hp // 32, per + -(-per // 32)  # an MXFP8 row of x, of the intermediate (codes + scales)
    counts = torch.bincount(routing(m, hidden, experts, top_k).reshape(-1).long(), minlength=experts).tolist()
    total = 0
    for n in counts:
        if n:
            rows = -(-n // 16) * 16
            total += math.ceil(n / gu_rows) * w13 + rows * a1 * math.ceil(2 * per / gu_cols)
            total += math.ceil(n / down_rows) * w2 + rows * a2 * math.ceil(hidden / down_cols)
    pairs = m * top_k
    total += m * hidden * 2 + m * a1 + pairs * a2 + 2 * pairs * hidden * 2 + m * hidden * 2
    return total / moe_cost(m, hidden, inter, experts, top_k, tp_size=tp_size, biases=biases).min_bytes


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", default="256,1024,2048,8192")
    args = ap.parse_args(argv)
    tokens = [int(t) for t in args.tokens.split(",")]
    print("issued bytes / min; tiles (gate-up rows x cols, down rows x cols):")
    print("| shape | tokens | " + " | ".join(f"{a}x{b}, {c}x{d}" for a, b, c, d in TILES) + " |")
    print("|---|---|" + "---|" * len(TILES))
    for name, (hidden, inter, tp, biases) in SHAPES.items():
        for m in tokens:
            cells = [f"{issued_x_min(m, hidden, inter, 128, 4, tp, biases, *t):.2f}" for t in TILES]
            print(f"| {name} | {m} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
