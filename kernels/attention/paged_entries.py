"""Host code shared by the attention/paged_q<Hq>_kv<Hkv>_d64 packages: argument checks, the decode and prefill
tiers, the custom op torch.ops.amd_kernels.<shape token>_paged_attention, and the emulator's workgroup sampler.

Tiers are chosen per sequence from its own query length, never from the batch: q_len 1 runs the decode tier
(paged_decode.py), q_len > 1 the prefill tier (paged_prefill.py), q_len 0 is padding. A batch with as many
sequences as query rows (vLLM's uniform decode batch, padded to a capture size) runs the decode launch only
and must have every q_len <= 1; any other batch runs both launches, each skipping the other's sequences.

(No `from __future__ import annotations`: torch.library reads the entry's annotations as types.)
"""

from types import SimpleNamespace

import torch

from amd_kernels import host, warm_up
from amd_kernels.attention import paged_decode as kd
from amd_kernels.attention import paged_prefill as kp

WINDOWS = {"full": 0, "window": 128}  # variant key -> sliding_window it serves (gpt-oss: 128 or none)
FP8 = "_fp8"  # variant key suffix of the fp8 KV tier
CHECK_VALUES_ENV = "AMD_KERNELS_CHECK_VALUES"
# The emulator's sampled runs give every KV head to a sampled sequence up to this many keys, one above it.
EMULATOR_ALL_HEADS_KEYS = 8192
# The split partials live in one workspace per device and package, sized for this many sequences (vLLM's
# largest default CUDA-graph capture size): graph capture sees the same pointers every call. Larger batches
# run in chunks of this many sequences (each sequence's bits are the same either way).
WORKSPACE_SEQUENCES = 512
# ... and at most this many Q tiles of a prefill sequence (whole-sequence checks ask for every row).
EMULATOR_TILES = 3

PREFILL = "prefill_"  # variant key prefix of the prefill tier: prefill_full, prefill_window


def _read_cu_upto(read, cu_ptr: int, row: int, most: int) -> list:
    """cu_seqlens_q[0 .. j] for the first j with cu_seqlens_q[j] > row (the sequences up to the one holding
    query row `row`, a real row), read entry by entry so nothing past the tensor is read; at most `most` + 1
    entries (a prefill launch's grid x is at least its batch)."""
    cu = []
    while len(cu) <= most and (not cu or cu[-1] <= row):
        cu.append(int(torch.frombuffer(bytearray(read(cu_ptr + 4 * len(cu), 4)), dtype=torch.int32)[0]))
    return cu


def variants(kv_heads: int, max_splits: int, min_split_blocks: int) -> dict:
    table = {key: kd.build(kv_heads, w, max_splits, min_split_blocks) for key, w in WINDOWS.items()}
    # the fp8 e4m3 KV tier (entry paged_attention_fp8, decode only): "<window key>_fp8"
    table.update({key + FP8: kd.build(kv_heads, w, max_splits, min_split_blocks, fp8=True)
                  for key, w in WINDOWS.items()})
    table.update({PREFILL + key: kp.build(kv_heads, w) for key, w in WINDOWS.items()})
    return table


def _check_values(cu: torch.Tensor, lens: torch.Tensor, table: torch.Tensor, num_blocks: int,
                  decode: bool) -> None:
    """The checks that read tensor values (a device sync on a GPU: run on CPU tensors, i.e. under the
    emulator, or when AMD_KERNELS_CHECK_VALUES=1 outside graph capture)."""
    cu, lens, table = cu.cpu(), lens.cpu(), table.cpu()
    q_len = cu[1:] - cu[:-1]
    if int(cu[0]) != 0 or bool((q_len < 0).any()):
        raise ValueError("cu_seqlens_q: must start at 0 and be non-decreasing")
    if decode and bool((q_len > 1).any()):
        raise ValueError("cu_seqlens_q: a batch of as many sequences as query rows is a decode batch: "
                         "at most one query row per sequence")
    if bool((q_len > lens).any()) or bool((lens < 0).any()):
        raise ValueError("seq_lens: a sequence has more query rows than keys (or a negative length)")
    blocks = (lens + kd.BLOCK - 1) // kd.BLOCK
    if bool((blocks > table.shape[1]).any()):
        raise ValueError(f"seq_lens: a sequence needs more than the block table's {table.shape[1]} blocks")
    used = torch.arange(table.shape[1])[None, :] < blocks[:, None]
    ids = table[used]
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= num_blocks):
        raise ValueError(f"block_table: a used entry lies outside [0, {num_blocks})")


def build(package: str, shape_token: str, kv_heads: int, max_splits: int, min_split_blocks: int,
          kernel_variants: dict, workspace_sequences: int = WORKSPACE_SEQUENCES) -> SimpleNamespace:
    Hkv = kv_heads
    Hq = Hkv * kd.GROUP
    D = kd.HEAD_DIM
    table = warm_up.VariantTable(package, {k: warm_up.Variant(*v) for k, v in kernel_variants.items()})
    modes = {"decode": list(WINDOWS), "prefill": list(WINDOWS) + [PREFILL + k for k in WINDOWS]}

    def mode_of(q, key_cache, value_cache, cu_seqlens_q, *args, **kwargs) -> str:
        return "decode" if cu_seqlens_q.shape[0] == q.shape[0] + 1 else "prefill"

    # i32 byte offsets into q / out [T, Hq, D] bf16 (the partials are addressed per chunk of sequences)
    max_tokens = host.max_tokens_for(Hq * D * 2)
    chunk = workspace_sequences
    part_o_elems = chunk * Hkv * max_splits * kd.GROUP * D
    part_ml_elems = chunk * Hkv * max_splits * kd.GROUP * 2
    workspaces = {}  # device -> fp32 [part_o_elems + part_ml_elems]

    def workspace(device: torch.device, sequences: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(part_o, part_ml) views for `sequences` <= chunk, in the device's workspace: allocated
        by the first call on the device (make it before CUDA-graph capture, as vLLM's warm-up run does), then
        reused. Calls on one device share it, so they must run in stream order (one stream at a time)."""
        ws = workspaces.get(device)
        if ws is None:
            ws = workspaces[device] = torch.empty(part_o_elems + part_ml_elems, dtype=torch.float32, device=device)
        part_o = ws[:part_o_elems].view(kd.part_o_shape(chunk, Hkv, max_splits))[:sequences]
        part_ml = ws[part_o_elems:].view(kd.part_ml_shape(chunk, Hkv, max_splits))[:sequences]
        return part_o, part_ml

    def release_workspaces() -> None:
        """Drop every device's workspace; the next call allocates its device's again (a new pointer). For a
        process that stops calling the entry for a while (the test harness, between shapes); a server keeps
        it, as graph capture recorded its pointer."""
        workspaces.clear()

    def outputs(q, key_cache, value_cache, cu_seqlens_q, seq_lens, block_table, sinks, sliding_window,
                cache_dtype=torch.bfloat16):
        """The checks and the output, shared by the entry and its fake (host.custom_op). The value checks
        that read device data (block ids, lengths) run only where they cost no device sync."""
        host.check_tokens("q", q, max_tokens)
        host.check_tensor("q", q, dtype=torch.bfloat16, shape=(None, Hq, D))
        T = q.shape[0]
        host.check_tensor("key_cache", key_cache, dtype=cache_dtype, shape=(None, kd.BLOCK, Hkv, D), like=q)
        host.check_tensor("value_cache", value_cache, dtype=cache_dtype, shape=tuple(key_cache.shape), like=q)
        host.check_tensor("seq_lens", seq_lens, dtype=torch.int32, shape=(None,), like=q)
        B = seq_lens.shape[0]
        if T and not 1 <= B <= T:
            raise ValueError(f"seq_lens: expected between 1 and {T} (the query rows) sequences, got {B}")
        host.check_tensor("cu_seqlens_q", cu_seqlens_q, dtype=torch.int32, shape=(B + 1,), like=q)
        host.check_tensor("block_table", block_table, dtype=torch.int32, shape=(B, None), like=q)
        if block_table.shape[1] < 1:
            raise ValueError("block_table: expected at least one column")
        host.check_tensor("sinks", sinks, dtype=torch.float32, shape=(Hq,), like=q)
        if sliding_window not in WINDOWS.values():
            raise ValueError(f"sliding_window: expected one of {sorted(WINDOWS.values())}, got {sliding_window}")
        if host.no_data(q):
            pass  # no data to read (torch.compile tracing, meta tensors)
        elif q.device.type == "cpu" or (host.env_flag(CHECK_VALUES_ENV)
                                        and not torch.cuda.is_current_stream_capturing()):
            _check_values(cu_seqlens_q, seq_lens, block_table, key_cache.shape[0], B == T)
        return torch.empty((T, Hq, D), dtype=torch.bfloat16, device=q.device)

    def launch(key, q, key_cache, value_cache, cu_seqlens_q, seq_lens, block_table, sinks, scales, out):
        """The decode tier over every sequence (those with q_len != 1 do nothing), in chunks of `chunk`
        sequences: the kernels index sequences from the views' starts and read q / write out at the absolute
        rows cu_seqlens_q names. Window layers never split (the partials stay unused)."""
        B = seq_lens.shape[0]
        for b0 in range(0, B, chunk):
            n = min(B - b0, chunk)
            part_o, part_ml = workspace(q.device, n)
            table[key](q, key_cache, value_cache, cu_seqlens_q[b0:b0 + n + 1], seq_lens[b0:b0 + n],
                       block_table[b0:b0 + n], sinks, *scales, out, part_o, part_ml, n, block_table.shape[1],
                       key_cache.shape[0], host.stream_of(q))
        return out

    @warm_up.entry(table, modes, mode_of)
    def paged_attention(q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                        cu_seqlens_q: torch.Tensor, seq_lens: torch.Tensor, block_table: torch.Tensor,
                        sinks: torch.Tensor, sliding_window: int) -> torch.Tensor:
        out = outputs(q, key_cache, value_cache, cu_seqlens_q, seq_lens, block_table, sinks, sliding_window)
        key = next(k for k, w in WINDOWS.items() if w == sliding_window)
        launch(key, q, key_cache, value_cache, cu_seqlens_q, seq_lens, block_table, sinks, (), out)
        T, B = q.shape[0], seq_lens.shape[0]
        if T and B != T:  # q_len > 1 possible: the prefill tier (grid x: each sequence's last tile + chunks)
            table[PREFILL + key](q, key_cache, value_cache, cu_seqlens_q, seq_lens, block_table, sinks, out,
                                 B, block_table.shape[1], kp.chunks_of(T), host.stream_of(q))
        return out

    # ---- the fp8 e4m3 KV tier: the decode kernels reading E4M3 codes (paged_decode.py), scales per tensor
    def outputs_fp8(q, key_cache, value_cache, cu_seqlens_q, seq_lens, block_table, sinks, sliding_window,
                    k_scale, v_scale):
        out = outputs(q, key_cache, value_cache, cu_seqlens_q, seq_lens, block_table, sinks, sliding_window,
                      torch.float8_e4m3fn)
        if seq_lens.shape[0] != q.shape[0]:
            raise ValueError(f"seq_lens: the fp8 KV tier serves decode batches only (one sequence per query "
                             f"row): expected {q.shape[0]} sequences, got {seq_lens.shape[0]}")
        host.check_tensor("k_scale", k_scale, dtype=torch.float32, shape=(1,), like=q)
        host.check_tensor("v_scale", v_scale, dtype=torch.float32, shape=(1,), like=q)
        return out

    def fp8_mode_of(*args, **kwargs) -> str:
        return "decode"  # decode only: a prefill batch gets outputs_fp8's error, not a missing-mode one

    @warm_up.entry(table, {"decode": [k + FP8 for k in WINDOWS]}, fp8_mode_of)
    def paged_attention_fp8(q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                            cu_seqlens_q: torch.Tensor, seq_lens: torch.Tensor, block_table: torch.Tensor,
                            sinks: torch.Tensor, sliding_window: int, k_scale: torch.Tensor,
                            v_scale: torch.Tensor) -> torch.Tensor:
        out = outputs_fp8(q, key_cache, value_cache, cu_seqlens_q, seq_lens, block_table, sinks, sliding_window,
                          k_scale, v_scale)
        key = next(k for k, w in WINDOWS.items() if w == sliding_window) + FP8
        return launch(key, q, key_cache, value_cache, cu_seqlens_q, seq_lens, block_table, sinks,
                      (k_scale, v_scale), out)

    def emulator_workgroups(tokens, kernel, grid, pointers, read):
        """The workgroups the sampled query rows `tokens` need: their sequences' splits (decode tier) or Q tiles
        (prefill tier, at most EMULATOR_TILES a sequence), in every KV head for sequences up to
        EMULATOR_ALL_HEADS_KEYS keys and in one (chosen by the sequence's length) above."""
        main = not kernel.endswith("_merge")
        prefill = kernel.startswith("paged_prefill")
        cu_ptr, lens_ptr = (pointers[3], pointers[4]) if main else (pointers[0], pointers[1])  # every tier
        if prefill:  # grid (batch + chunks, KV heads): read cu_seqlens_q up to the last sampled row's sequence
            cu = _read_cu_upto(read, cu_ptr, max(tokens, default=0), grid[0])
            batch = len(cu) - 1
        else:
            batch = grid[2] if main else grid[1]
            cu = torch.frombuffer(bytearray(read(cu_ptr, (batch + 1) * 4)), dtype=torch.int32).tolist()
        lens = torch.frombuffer(bytearray(read(lens_ptr, batch * 4)), dtype=torch.int32).tolist()
        chosen = set()
        for b in range(batch):
            mine = [t - cu[b] for t in tokens if cu[b] <= t < cu[b + 1]]
            if not mine:
                continue
            # the head follows the sequence's own length, so a sequence alone and in a batch picks the same
            heads = range(Hkv) if lens[b] <= EMULATOR_ALL_HEADS_KEYS else [(lens[b] * 7 + 3) % Hkv]
            if prefill:  # at most EMULATOR_TILES Q tiles: those of the first, middle and last sampled rows
                tiles = sorted({t // kp.TILE_TOKENS for t in mine})
                if len(tiles) > EMULATOR_TILES:
                    tiles = [tiles[0], tiles[len(tiles) // 2], tiles[-1]]
            for h in heads:
                if prefill:
                    nt = kp.tiles_of(cu[b + 1] - cu[b])
                    chosen |= {(kp.workgroup_of(b, t, cu, grid[0]), h, 0) for t in tiles if nt}
                elif main:
                    chosen |= {(x, h, b) for x in range(grid[0])}
                else:
                    chosen.add((h, b, 0))
        return chosen

    op = host.custom_op(f"amd_kernels::{shape_token}_paged_attention", paged_attention, outputs)
    op_fp8 = host.custom_op(f"amd_kernels::{shape_token}_paged_attention_fp8", paged_attention_fp8, outputs_fp8)
    op.max_tokens = op_fp8.max_tokens = max_tokens
    return SimpleNamespace(VARIANTS=table, paged_attention=op, paged_attention_fp8=op_fp8,
                           emulator_workgroups=emulator_workgroups, workspace=workspace,
                           release_workspaces=release_workspaces,
                           workspace_bytes=(part_o_elems + part_ml_elems) * 4)
