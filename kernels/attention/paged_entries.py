"""Host code shared by the attention/paged_q<Hq>_kv<Hkv>_d64 packages: argument checks, the decode tier,
the custom op torch.ops.amd_kernels.<shape token>_paged_attention, and the emulator's workgroup sampler.

(No `from __future__ import annotations`: torch.library reads the entry's annotations as types.)
"""

from types import SimpleNamespace

import torch

from amd_kernels import host, warm_up
from amd_kernels.attention import paged_decode as kd

WINDOWS = {"full": 0, "window": 128}  # variant key -> sliding_window it serves (gpt-oss: 128 or none)
CHECK_VALUES_ENV = "AMD_KERNELS_CHECK_VALUES"
# The emulator's sampled runs give every KV head to a sampled sequence up to this many keys, one above it.
EMULATOR_ALL_HEADS_KEYS = 8192


def variants(kv_heads: int, max_splits: int, min_split_blocks: int) -> dict:
    return {key: kd.build(kv_heads, w, max_splits, min_split_blocks) for key, w in WINDOWS.items()}


def _check_values(cu: torch.Tensor, lens: torch.Tensor, table: torch.Tensor, num_blocks: int) -> None:
    """The checks that read tensor values (a device sync on a GPU: run on CPU tensors, i.e. under the
    emulator, or when AMD_KERNELS_CHECK_VALUES=1 outside graph capture)."""
    cu, lens, table = cu.cpu(), lens.cpu(), table.cpu()
    q_len = cu[1:] - cu[:-1]
    if int(cu[0]) != 0 or bool((q_len < 0).any()):
        raise ValueError("cu_seqlens_q: must start at 0 and be non-decreasing")
    if bool((q_len > 1).any()):
        raise ValueError("cu_seqlens_q: the decode tier takes at most one query row per sequence")
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
          kernel_variants: dict) -> SimpleNamespace:
    Hkv = kv_heads
    Hq = Hkv * kd.GROUP
    D = kd.HEAD_DIM
    table = warm_up.VariantTable(package, {k: warm_up.Variant(*v) for k, v in kernel_variants.items()})
    modes = {"decode": list(WINDOWS)}

    def mode_of(*args, **kwargs) -> str:
        return "decode"

    # i32 byte offsets into q / out [T, Hq, D] bf16 and the split partials [T, Hkv, max_splits, GROUP, D] fp32
    max_tokens = min(host.max_tokens_for(Hq * D * 2), host.max_tokens_for(Hkv * max_splits * kd.GROUP * D * 4))

    def outputs(q, key_cache, value_cache, cu_seqlens_q, seq_lens, block_table, sinks, sliding_window):
        """The checks and the output, shared by the entry and its fake (host.custom_op). The value checks
        that read device data (block ids, lengths) run only where they cost no device sync."""
        host.check_tokens("q", q, max_tokens)
        host.check_tensor("q", q, dtype=torch.bfloat16, shape=(None, Hq, D))
        T = q.shape[0]
        host.check_tensor("key_cache", key_cache, dtype=torch.bfloat16, shape=(None, kd.BLOCK, Hkv, D), like=q)
        host.check_tensor("value_cache", value_cache, dtype=torch.bfloat16, shape=tuple(key_cache.shape), like=q)
        # decode tier: one query row per sequence (vLLM's uniform decode batch, padded to a capture size)
        host.check_tensor("cu_seqlens_q", cu_seqlens_q, dtype=torch.int32, shape=(T + 1,), like=q,
                          hint="the decode tier takes one query row per sequence")
        host.check_tensor("seq_lens", seq_lens, dtype=torch.int32, shape=(T,), like=q)
        host.check_tensor("block_table", block_table, dtype=torch.int32, shape=(T, None), like=q)
        if block_table.shape[1] < 1:
            raise ValueError("block_table: expected at least one column")
        host.check_tensor("sinks", sinks, dtype=torch.float32, shape=(Hq,), like=q)
        if sliding_window not in WINDOWS.values():
            raise ValueError(f"sliding_window: expected one of {sorted(WINDOWS.values())}, got {sliding_window}")
        if host.no_data(q):
            pass  # no data to read (torch.compile tracing, meta tensors)
        elif q.device.type == "cpu" or (host.env_flag(CHECK_VALUES_ENV)
                                        and not torch.cuda.is_current_stream_capturing()):
            _check_values(cu_seqlens_q, seq_lens, block_table, key_cache.shape[0])
        return torch.empty((T, Hq, D), dtype=torch.bfloat16, device=q.device)

    @warm_up.entry(table, modes, mode_of)
    def paged_attention(q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                        cu_seqlens_q: torch.Tensor, seq_lens: torch.Tensor, block_table: torch.Tensor,
                        sinks: torch.Tensor, sliding_window: int) -> torch.Tensor:
        out = outputs(q, key_cache, value_cache, cu_seqlens_q, seq_lens, block_table, sinks, sliding_window)
        T = q.shape[0]
        if T:
            key = next(k for k, w in WINDOWS.items() if w == sliding_window)
            splits = 1 if sliding_window else max_splits
            # window layers never split: a one-element stand-in of the same rank
            part_o = torch.empty(kd.part_o_shape(T, Hkv, splits) if not sliding_window else (1,) * 5,
                                 dtype=torch.float32, device=q.device)
            part_ml = torch.empty(kd.part_ml_shape(T, Hkv, splits) if not sliding_window else (1,) * 5,
                                  dtype=torch.float32, device=q.device)
            table[key](q, key_cache, value_cache, cu_seqlens_q, seq_lens, block_table, sinks, out, part_o,
                       part_ml, T, block_table.shape[1], key_cache.shape[0], host.stream_of(q))
        return out

    def emulator_workgroups(tokens, kernel, grid, pointers, read):
        """The workgroups the sampled query rows `tokens` need: their sequences' splits, in every KV head for
        sequences up to EMULATOR_ALL_HEADS_KEYS keys and in one (seeded by the sequence) above."""
        main = not kernel.endswith("_merge")
        cu_ptr, lens_ptr = (pointers[3], pointers[4]) if main else (pointers[0], pointers[1])
        batch = grid[2] if main else grid[1]
        cu = torch.frombuffer(bytearray(read(cu_ptr, (batch + 1) * 4)), dtype=torch.int32).tolist()
        lens = torch.frombuffer(bytearray(read(lens_ptr, batch * 4)), dtype=torch.int32).tolist()
        chosen = set()
        for b in range(batch):
            if not any(cu[b] <= t < cu[b + 1] for t in tokens):
                continue
            heads = range(Hkv) if lens[b] <= EMULATOR_ALL_HEADS_KEYS else [(b * 7 + 3) % Hkv]
            for h in heads:
                if main:
                    chosen |= {(x, h, b) for x in range(grid[0])}
                else:
                    chosen.add((h, b, 0))
        return chosen

    op = host.custom_op(f"amd_kernels::{shape_token}_paged_attention", paged_attention, outputs)
    op.max_tokens = max_tokens
    return SimpleNamespace(VARIANTS=table, paged_attention=op, emulator_workgroups=emulator_workgroups)
