"""The emulator's sampling hook (kernel.toml `workgroups = "tokens"`): which workgroups of each launch the
sampled token rows need. Host-only; the emulator calls it, the kernels never do."""

import torch

from amd_kernels.moe.mxfp4_moe import prefill
from amd_kernels.moe.mxfp4_moe.geometry import ROWS, prefill_suffix, super_pack


def make(geo):
    name, top_k = geo.name, geo.top_k
    # Tensor positions of (sorted_pairs, meta) among each tile launch's arguments.
    # The prefill tiers' tile launches: workgroup x runs super-tile x, of up to `waves` tiles.
    super_launches = {f"{name}_{stage}{prefill_suffix(w)}": w for w in prefill.WAVES for stage in ("gate_up", "down")}
    tile_launches = {f"{name}_gate_up": (2, 4), f"{name}_gate_up_small_m": (2, 4), f"{name}_down": (2, 4),
                     f"{name}_down_combine": (2, 4), **{k: (2, 4) for k in super_launches}}

    def emulator_workgroups(tokens, kernel, grid, pointers, read):
        """The workgroups `tokens`' output rows need (None: all of them). quant and sort (and the routed entry's
        router + quant + sort, whose tickets need every workgroup) run whole; gate-up
        and down run the tiles holding a pair of one of the tokens (read from the sort's result); combine
        runs the tokens' rows; the prefill tier's tile launches run the super-tiles holding them."""
        if kernel == f"{name}_combine":
            return {(t, 0, 0) for t in tokens}
        if kernel not in tile_launches:
            return None
        sp, mt = (pointers[i] for i in tile_launches[kernel])
        n_tiles = int.from_bytes(read(mt, 4), "little")
        if kernel not in super_launches:
            n_tiles = min(n_tiles, grid[0])
        pairs = torch.frombuffer(bytearray(read(sp, n_tiles * ROWS * 4)), dtype=torch.int32).reshape(-1, ROWS)
        wanted = torch.tensor(sorted(tokens), dtype=torch.int32)
        hit = ((pairs >= 0) & torch.isin(pairs // top_k, wanted)).any(dim=1)
        tiles = [int(t) for t in hit.nonzero().flatten()]
        if kernel in super_launches:  # the super-tile holding the tile (the table in meta, prefill.super_tile)
            n_sup = min(int.from_bytes(read(mt + 4, 4), "little"), grid[0])
            table = torch.frombuffer(bytearray(read(mt + 16, n_sup * 4)), dtype=torch.int32).tolist()
            pack = super_pack(super_launches[kernel])
            of = {packed // pack + i: s for s, packed in enumerate(table) for i in range(packed % pack)}
            tiles = [of[t] for t in tiles]
        return {(t, y, z) for t in tiles for y in range(grid[1]) for z in range(grid[2])}

    return emulator_workgroups
