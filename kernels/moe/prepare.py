"""Weight preparation for the MXFP4 MoE kernels: checkpoint layout -> the kernels' preshuffled layout.

Runs once at load time (torch ops, any device). Input, per layer (the gpt-oss / OCP MX checkpoint layout,
the [.., K/32, 16] blocks flattened to [.., K/2]):
  w13_blocks uint8 [E, 2I, h/2]   E2M1 codes, low nibble = even k      w13_scales uint8 [E, 2I, h/32]  E8M0
  w2_blocks  uint8 [E, h, I/2]                                          w2_scales  uint8 [E, h, I/32]
  w13_bias, w2_bias bf16 [E, 2I], [E, h] (gpt-oss) or None
  activation "gptoss" (rows 2i = gate i, 2i+1 = up i) or "swiglu" (rows [0, I) gate, [I, 2I) up).

Sharding (tp_size > 1): rank r owns intermediate columns [start, end) = [r I/tp, (r+1) I/tp). The
prepared intermediate axis is the global range [lo, hi) of the 32-blocks those columns touch, re-based to
0 and zero-padded to IP (a multiple of 128): a prepared 32-block is exactly one checkpoint scale block,
so every code and every scale byte is copied, never requantized. Codes of columns outside [start, end)
(the neighbouring rank's half of a straddling block) are set to 0, and so are their w13 rows, so those
intermediate values are exactly 0 and add nothing. For gpt-oss TP8 (I 2880 -> 360 per rank) every rank's
span fits in 12 blocks: IP = 384. The w2 bias is kept on rank 0 only (vLLM all-reduces the partials).

Output (all contiguous, what the kernels read):
  w13  uint8 [E, 2 IP/16, KS1, 64, 16]   group g of 16 rows: for intermediate block b = g // 4,
         g % 4 = 0, 1: gate columns 32b + 16 (g % 4) + (0..15); 2, 3: up columns 32b + 16 (g % 4 - 2) + ...
         [e, g, ks, l, t] = byte ks*64 + 16*(l // 16) + t of row (g, l % 16): lane l's B operand of K-step ks
  w13_scale uint8 [E, 2 IP/16, KG1, 64, 4]  byte b of lane l, group j = E8M0 of K-block 4(4j + b) + l // 16
  w13_bias fp32 [E, 2 IP] (prepared row order; zeros without bias)
  w2   uint8 [E, h/16, KS2, 64, 16], w2_scale uint8 [E, h/16, KG2, 64, 4]  (the same over K = IP)
  w2_bias fp32 [E, h]
  When a rank's columns do not fill whole 32-blocks (w2_planes: gpt-oss TP8), w2 and w2_scale take these
  layouts instead, so the down kernel can skip the dead codes of the straddling blocks in whole 64-byte runs
  and the scales have no padding: w2 in dword planes, [e, g, ks, 256 q + 64 d + 4 r + t] = byte 4d + t of lane 16q + r above;
  w2_scale uint8 [E, h/64, KS2, 64, 4]: byte g of lane l at K-step ks = E8M0 of row 64 nb + 16 g + l % 16,
  K-block 4 ks + l // 16 (one dword per lane per K-step for the workgroup's 4 groups, no padding).
  shard int32 [4]   (first live prepared column, end of the live columns, 1 if the w2 bias is added, 0): the
         kernels do not load weight bytes of dead columns, nor a w2 bias that is not added
with HP = h rounded up to 128, KS1 = HP/128, KG1 = ceil(KS1/4), KS2 = IP/128, KG2 = ceil(KS2/4); K past the
checkpoint's end is zero codes with scale byte 0.
"""

from __future__ import annotations

import torch

BLOCK = 32
KSTEP = 128
# Dtype of each prepared tensor (the MoE entries check them).
WEIGHT_DTYPES = {"w13": torch.uint8, "w13_scale": torch.uint8, "w13_bias": torch.float32, "w2": torch.uint8,
                 "w2_scale": torch.uint8, "w2_bias": torch.float32, "shard": torch.int32}


def round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def shard_span(inter: int, tp_size: int, tp_rank: int) -> tuple[int, int, int, int]:
    """(start, end, lo, hi): the rank's intermediate columns and the 32-aligned span of blocks they touch."""
    if inter % tp_size or not 0 <= tp_rank < tp_size:
        raise ValueError(f"tp_size/tp_rank: {tp_size}/{tp_rank} do not shard intermediate {inter}")
    per = inter // tp_size
    start, end = tp_rank * per, (tp_rank + 1) * per
    return start, end, start // BLOCK * BLOCK, round_up(end, BLOCK)


def padded_intermediate(inter: int, tp_size: int) -> int:
    """IP: the largest span of any rank, rounded up to 128 (the same for every rank)."""
    spans = [shard_span(inter, tp_size, r) for r in range(tp_size)]
    return round_up(max(hi - lo for _, _, lo, hi in spans), KSTEP)


def _unpack(blocks: torch.Tensor) -> torch.Tensor:
    return torch.stack((blocks & 0xF, blocks >> 4), dim=-1).reshape(*blocks.shape[:-1], blocks.shape[-1] * 2)


def _pack(codes: torch.Tensor) -> torch.Tensor:
    c = codes.reshape(*codes.shape[:-1], codes.shape[-1] // 2, 2)
    return (c[..., 0] | (c[..., 1] << 4)).to(torch.uint8)


def w2_planes(inter: int, tp_size: int) -> bool:
    """Whether w2 takes the dword-plane layouts: a rank's columns straddle 32-column scale blocks."""
    return (inter // tp_size) % BLOCK != 0


def _dword_planes(b: torch.Tensor) -> torch.Tensor:
    """Lane-major B [E, N/16, KS, 64, 16] -> dword planes: per lane group q, dword d of its 16 lanes together."""
    e, ng, ks = b.shape[:3]
    return b.reshape(e, ng, ks, 4, 16, 4, 4).permute(0, 1, 2, 3, 5, 4, 6).reshape(e, ng, ks, 64, 16).contiguous()


def _kstep_scales(scales: torch.Tensor) -> torch.Tensor:
    """[E, N, K/32] (N % 64 == 0, K % 128 == 0) -> [E, N/64, K/128, 64, 4]: per K-step, lane 16q + r's dword
    holds the 4 groups' E8M0 of K-block 4 ks + q."""
    e, n, kb = scales.shape
    s = scales.reshape(e, n // 64, 4, 16, kb // 4, 4)  # [e, nb, g, r, ks, q]
    return s.permute(0, 1, 4, 5, 3, 2).reshape(e, n // 64, kb // 4, 64, 4).contiguous()


def _shuffle_b(blocks: torch.Tensor, scales: torch.Tensor, k_pad: int):
    """[E, N, K/2] codes + [E, N, K/32] scales (N % 16 == 0) -> lane-major B operand + scale layouts."""
    e, n, kh = blocks.shape
    ks = k_pad // KSTEP
    kg = -(-ks // 4)
    b = torch.zeros(e, n, k_pad // 2, dtype=torch.uint8, device=blocks.device)
    b[:, :, :kh] = blocks
    # [e, n/16, r, ks, q, t] -> [e, n/16, ks, q, r, t]
    b = b.reshape(e, n // 16, 16, ks, 4, 16).permute(0, 1, 3, 4, 2, 5).reshape(e, n // 16, ks, 64, 16)
    s = torch.zeros(e, n, kg * 16, dtype=torch.uint8, device=blocks.device)
    s[:, :, : scales.shape[2]] = scales
    # K-block index = 4 * (4j + b) + q  ->  [e, n/16, r, j, b, q] -> [e, n/16, j, q, r, b]
    s = s.reshape(e, n // 16, 16, kg, 4, 4).permute(0, 1, 3, 5, 2, 4).reshape(e, n // 16, kg, 64, 4)
    return b.contiguous(), s.contiguous()


def prepare_weights(w13_blocks, w13_scales, w13_bias, w2_blocks, w2_scales, w2_bias, *, activation: str,
                    tp_size: int = 1, tp_rank: int = 0, experts_per_chunk: int = 8) -> dict:
    """Checkpoint tensors -> {w13, w13_scale, w13_bias, w2, w2_scale, w2_bias, shard} (see the module docstring).

    Works through the experts in chunks so the temporaries stay a few chunks' size, not the layer's."""
    if activation not in ("gptoss", "swiglu"):
        raise ValueError(f"activation: expected 'gptoss' or 'swiglu', got {activation!r}")
    if activation == "swiglu" and (w13_bias is not None or w2_bias is not None):
        raise ValueError("w13_bias / w2_bias: the swiglu MoE has no biases (its kernels never read them); pass None")
    e = w13_blocks.shape[0]
    out = None
    for e0 in range(0, e, experts_per_chunk):
        sl = slice(e0, min(e, e0 + experts_per_chunk))
        part = _prepare(w13_blocks[sl], w13_scales[sl], None if w13_bias is None else w13_bias[sl], w2_blocks[sl],
                        w2_scales[sl], None if w2_bias is None else w2_bias[sl], activation, tp_size, tp_rank)
        if out is None:
            out = {k: torch.empty((e, *v.shape[1:]), dtype=v.dtype, device=v.device) for k, v in part.items()}
        for k, v in part.items():
            out[k][sl] = v
    start, end, lo, _ = shard_span(w13_blocks.shape[1] // 2, tp_size, tp_rank)
    bias_on = int(w2_bias is not None and tp_rank == 0)
    out["shard"] = torch.tensor([start - lo, end - lo, bias_on, 0], dtype=torch.int32, device=w13_blocks.device)
    return out


def _prepare(w13_blocks, w13_scales, w13_bias, w2_blocks, w2_scales, w2_bias, activation, tp_size, tp_rank):
    e, two_i, hh = w13_blocks.shape
    inter, hidden = two_i // 2, hh * 2
    if w2_blocks.shape != (e, hidden, inter // 2):
        raise ValueError(f"w2_blocks: expected shape {[e, hidden, inter // 2]}, got {list(w2_blocks.shape)}")
    if w13_scales.shape != (e, two_i, hidden // BLOCK) or w2_scales.shape != (e, hidden, inter // BLOCK):
        raise ValueError("w13_scales / w2_scales: shapes do not match the blocks")
    start, end, lo, hi = shard_span(inter, tp_size, tp_rank)
    ip = padded_intermediate(inter, tp_size)
    hp = round_up(hidden, KSTEP)
    dev = w13_blocks.device
    cols = torch.arange(lo, lo + ip, device=dev)  # global intermediate column of each prepared column
    live = (cols >= start) & (cols < end)
    colc = cols.clamp(max=inter - 1)
    if activation == "gptoss":
        gate_rows, up_rows = 2 * colc, 2 * colc + 1
    else:
        gate_rows, up_rows = colc, colc + inter
    # Prepared row order: per 32-column block b: gate 32 columns, then up 32 columns.
    nb = ip // BLOCK
    rows = torch.stack((gate_rows.reshape(nb, BLOCK), up_rows.reshape(nb, BLOCK)), dim=1).reshape(-1)
    row_live = torch.stack((live.reshape(nb, BLOCK), live.reshape(nb, BLOCK)), dim=1).reshape(-1)
    blocks13 = w13_blocks[:, rows] * row_live.view(1, -1, 1).to(torch.uint8)
    scales13 = w13_scales[:, rows] * row_live.view(1, -1, 1).to(torch.uint8)
    w13, w13_scale = _shuffle_b(blocks13, scales13, hp)
    bias13 = torch.zeros(e, 2 * ip, dtype=torch.float32, device=dev)
    if w13_bias is not None:
        bias13 = w13_bias[:, rows].float() * row_live.view(1, -1).float()

    # w2: columns [lo, lo + IP) of the checkpoint's K, codes outside [start, end) zeroed, scales copied.
    codes2 = _unpack(w2_blocks)
    k_cols = torch.zeros(e, hidden, ip, dtype=torch.uint8, device=dev)
    n_copy = min(hi, inter) - lo
    k_cols[:, :, :n_copy] = codes2[:, :, lo : lo + n_copy]
    k_cols *= live.view(1, 1, -1).to(torch.uint8)
    scales2 = torch.zeros(e, hidden, ip // BLOCK, dtype=torch.uint8, device=dev)
    scales2[:, :, : n_copy // BLOCK] = w2_scales[:, :, lo // BLOCK : lo // BLOCK + n_copy // BLOCK]
    w2, w2_scale = _shuffle_b(_pack(k_cols), scales2, ip)
    if w2_planes(inter, tp_size):
        w2, w2_scale = _dword_planes(w2), _kstep_scales(scales2)
    bias2 = torch.zeros(e, hidden, dtype=torch.float32, device=dev)
    if w2_bias is not None and tp_rank == 0:
        bias2 = w2_bias.float().clone()
    return {"w13": w13, "w13_scale": w13_scale, "w13_bias": bias13.contiguous(),
            "w2": w2, "w2_scale": w2_scale, "w2_bias": bias2.contiguous()}


def unshuffle_b(b: torch.Tensor, s: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of the B layouts (for tests): -> codes [E, N, k/2] and scales [E, N, k/32]."""
    e, ng, ks, _, _ = b.shape
    kg = s.shape[2]
    codes = b.reshape(e, ng, ks, 4, 16, 16).permute(0, 1, 4, 2, 3, 5).reshape(e, ng * 16, ks * 64)
    scales = s.reshape(e, ng, kg, 4, 16, 4).permute(0, 1, 4, 2, 5, 3).reshape(e, ng * 16, kg * 16)
    return codes[:, :, : k // 2], scales[:, :, : k // BLOCK]


def unshuffle_w2(b: torch.Tensor, s: torch.Tensor, k: int, planes: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of either w2 layout (for tests): -> codes [E, h, k/2] and scales [E, h, k/32]."""
    if not planes:
        return unshuffle_b(b, s, k)
    e, ng, ks = b.shape[:3]
    lanes = b.reshape(e, ng, ks, 4, 4, 16, 4).permute(0, 1, 2, 3, 5, 4, 6).reshape(e, ng, ks, 64, 16)
    codes = lanes.reshape(e, ng, ks, 4, 16, 16).permute(0, 1, 4, 2, 3, 5).reshape(e, ng * 16, ks * 64)
    scales = s.reshape(e, ng // 4, ks, 4, 16, 4).permute(0, 1, 5, 4, 2, 3).reshape(e, ng * 16, ks * 4)
    return codes[:, :, : k // 2], scales[:, :, : k // BLOCK]
