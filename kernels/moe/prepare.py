"""Weight preparation for the MXFP4 MoE kernels: checkpoint layout -> the kernels' preshuffled layout.

Runs once at load time (torch ops, any device). Input, per layer (the gpt-oss / OCP MX checkpoint layout,
the [.., K/32, 16] blocks flattened to [.., K/2]):
  w13_blocks uint8 [E, 2I, h/2]   E2M1 codes, low nibble = even k      w13_scales uint8 [E, 2I, h/32]  E8M0
  w2_blocks  uint8 [E, h, I/2]                                          w2_scales  uint8 [E, h, I/32]
  w13_bias, w2_bias bf16 [E, 2I], [E, h] (gpt-oss) or None
  activation "gptoss" (rows 2i = gate i, 2i+1 = up i) or "swiglu" (rows [0, I) gate, [I, 2I) up).

Sharding (tp_size > 1), as vLLM's gpt-oss MXFP4 loader cuts the checkpoint: whole 32-column scale blocks,
ceil(I/32 / tp) of them per rank, per = 32 ceil(I/32 / tp) columns; rank r owns [start, end) =
[per r, min(per (r+1), I)) (gpt-oss TP8: per = 384, rank 7 holds the last 192 columns). No block straddles
two ranks, so every code and scale byte is copied, never requantized. The prepared intermediate is the rank's
columns re-based to 0 and zero-padded to IP = per rounded up to 128 (384 at TP8); padded columns have zero
codes, scales and biases and add nothing. The w2 bias is kept on rank 0 only (vLLM all-reduces the partials).
`prepare_weights` takes either the full checkpoint (cut here for tp_rank) or exactly the slice vLLM's loader
gives rank tp_rank (w13 rows [2 start, 2 end), w2 columns [start, end), the w2 bias whole), optionally
zero-padded to IP columns as vLLM's parameters hold it; which one is told by the shapes.

Output (all contiguous, what the kernels read):
  w13  uint8 [E, 2 IP/16, KS1, 64, 16]   group g of 16 rows: for intermediate block b = g // 4,
         g % 4 = 0, 1: gate columns 32b + 16 (g % 4) + (0..15); 2, 3: up columns 32b + 16 (g % 4 - 2) + ...
         [e, g, ks, l, t] = byte ks*64 + 16*(l // 16) + t of row (g, l % 16): lane l's B operand of K-step ks
  w13_scale uint8 [E, 2 IP/16, KG1, 64, 4]  byte b of lane l, group j = E8M0 of K-block 4(4j + b) + l // 16
  w13_bias fp32 [E, 2 IP] (prepared row order; zeros without bias)
  w2   uint8 [E, h/16, KS2, 64, 16], w2_scale uint8 [E, h/16, KG2, 64, 4]  (the same over K = IP)
  w2_bias fp32 [E, h]
  shard int32 [4]   (first live prepared column (0), end of the live columns, 1 if the w2 bias is added, 0):
         the kernels do not load weight bytes of padded columns, nor a w2 bias that is not added
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


def shard_span(inter: int, tp_size: int, tp_rank: int) -> tuple[int, int]:
    """(start, end): the rank's intermediate columns, whole 32-column blocks (vLLM's gpt-oss rule)."""
    if inter % BLOCK or tp_size < 1 or not 0 <= tp_rank < tp_size:
        raise ValueError(f"tp_size/tp_rank: {tp_size}/{tp_rank} do not shard intermediate {inter}")
    per = -(-(inter // BLOCK) // tp_size) * BLOCK
    start, end = tp_rank * per, min((tp_rank + 1) * per, inter)
    if start >= end:
        raise ValueError(f"tp_rank: rank {tp_rank} of {tp_size} gets no column of intermediate {inter}")
    return start, end


def padded_intermediate(inter: int, tp_size: int) -> int:
    """IP: the largest rank's columns rounded up to 128 (the same for every rank)."""
    return round_up(max(e - s for s, e in (shard_span(inter, tp_size, r) for r in range(tp_size))), KSTEP)



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
                    hidden: int, intermediate: int, experts: int, tp_size: int = 1, tp_rank: int = 0,
                    experts_per_chunk: int = 2) -> dict:
    """Checkpoint tensors -> {w13, w13_scale, w13_bias, w2, w2_scale, w2_bias, shard} (see the module docstring).

    hidden, intermediate (unsharded) and experts are the package's shape; the tensors are the full checkpoint
    or rank tp_rank's slice of it. Works through the experts in chunks so the temporaries stay a few chunks'
    size, not the layer's."""
    if activation not in ("gptoss", "swiglu"):
        raise ValueError(f"activation: expected 'gptoss' or 'swiglu', got {activation!r}")
    if activation == "swiglu" and (w13_bias is not None or w2_bias is not None):
        raise ValueError("w13_bias / w2_bias: the swiglu MoE has no biases (its kernels never read them); pass None")
    start, end = shard_span(intermediate, tp_size, tp_rank)
    ip = padded_intermediate(intermediate, tp_size)
    cut, rows = _rank_slice(dict(w13_blocks=w13_blocks, w13_scales=w13_scales, w13_bias=w13_bias,
                                 w2_blocks=w2_blocks, w2_scales=w2_scales, w2_bias=w2_bias), activation, hidden,
                            intermediate, experts, tp_size, tp_rank, start, end, ip)
    bias_on = w2_bias is not None and tp_rank == 0
    out = None
    for e0 in range(0, experts, experts_per_chunk):
        sl = slice(e0, min(experts, e0 + experts_per_chunk))
        chunk = {k: None if v is None else v[sl] for k, v in cut.items()}
        for k in ("w13_blocks", "w13_scales", "w13_bias"):  # the rank's w13 rows, gathered a chunk at a time
            chunk[k] = None if chunk[k] is None else chunk[k][:, rows]
        part = _prepare(chunk, activation, end - start, ip, bias_on)
        if out is None:
            out = {k: torch.empty((experts, *v.shape[1:]), dtype=v.dtype, device=v.device) for k, v in part.items()}
        for k, v in part.items():
            out[k][sl] = v
    out["shard"] = torch.tensor([0, end - start, int(bias_on), 0], dtype=torch.int32, device=w13_blocks.device)
    return out


def _rank_slice(t: dict, activation, hidden, inter, experts, tp_size, tp_rank, start, end, ip):
    """The checkpoint tensors -> (views, w13 rows): rank tp_rank's slice (n = end - start columns, a TP1
    checkpoint of intermediate n) is the views with the w13 tensors' dim 1 indexed by the rows (left to the
    caller, per chunk of experts: indexing the whole w13 would copy ~1 GB at TP1); each tensor is checked
    against the package's dims with an error naming it."""
    n = end - start
    forms = [(inter, "the full checkpoint"), (n, f"rank {tp_rank}'s slice as vLLM's loader gives it"),
             (ip, f"rank {tp_rank}'s slice zero-padded to {ip} columns")]
    forms = [f for i, f in enumerate(forms) if f[0] not in [g[0] for g in forms[:i]]]
    where = f"this MoE (hidden {hidden}, intermediate {inter} over tp_size {tp_size}, {experts} experts)"
    for name in ("w13_blocks", "w13_scales", "w2_blocks", "w2_scales", "w13_bias", "w2_bias"):
        if t[name] is None and name.endswith("bias"):
            continue
        if not isinstance(t[name], torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t[name]).__name__}")
        want = torch.uint8 if not name.endswith("bias") else None
        if want is not None and t[name].dtype != want:
            raise TypeError(f"{name}: expected dtype {want} (checkpoint bytes), got {t[name].dtype}")
        if want is None and not t[name].dtype.is_floating_point:
            raise TypeError(f"{name}: expected a floating-point bias, got {t[name].dtype}")
    shapes = {"w13_blocks": lambda c: (experts, 2 * c, hidden // 2),
              "w13_scales": lambda c: (experts, 2 * c, hidden // BLOCK), "w13_bias": lambda c: (experts, 2 * c),
              "w2_blocks": lambda c: (experts, hidden, c // 2), "w2_scales": lambda c: (experts, hidden, c // BLOCK)}
    form = None
    for name, shape_of in shapes.items():
        if t[name] is None:
            continue
        got = tuple(t[name].shape)
        match = [f for f in forms if got == shape_of(f[0])]
        if not match:
            options = " or ".join(f"{list(shape_of(c))} ({what})" for c, what in forms)
            raise ValueError(f"{name}: shape {list(got)} is not a checkpoint of {where}: expected {options}")
        if form is None:
            form = match[0]
        elif form not in match:
            raise ValueError(f"{name}: shape {list(got)} is {match[0][1]}, but w13_blocks is {form[1]}")
    if t["w2_bias"] is not None and tuple(t["w2_bias"].shape) != (experts, hidden):
        raise ValueError(f"w2_bias: expected shape {[experts, hidden]} (whole, on every rank), "
                         f"got {list(t['w2_bias'].shape)}")
    c0, c1 = (start, end) if form[0] == inter else (0, n)
    if activation == "gptoss":  # interleaved rows: gate 2i, up 2i + 1
        rows = torch.arange(2 * c0, 2 * c1, device=t["w13_blocks"].device)
    else:  # [gate; up], each form's up rows start at its column count
        rows = torch.cat((torch.arange(c0, c1), torch.arange(form[0] + c0, form[0] + c1))).to(t["w13_blocks"].device)
    out = {k: t[k] for k in ("w13_blocks", "w13_scales", "w13_bias")}
    out["w2_blocks"] = t["w2_blocks"][:, :, c0 // 2: c1 // 2]
    out["w2_scales"] = t["w2_scales"][:, :, c0 // BLOCK: c1 // BLOCK]
    out["w2_bias"] = t["w2_bias"]
    return out, rows


def _prepare(t: dict, activation: str, n: int, ip: int, bias_on: bool) -> dict:
    """One chunk of experts of a rank slice (n columns) -> the prepared layouts over IP columns."""
    e, _, hh = t["w13_blocks"].shape
    hidden = hh * 2
    hp = round_up(hidden, KSTEP)
    dev = t["w13_blocks"].device
    cols = torch.arange(ip, device=dev)
    live = cols < n  # padded columns: zero codes, scales and bias
    colc = cols.clamp(max=n - 1)
    if activation == "gptoss":
        gate_rows, up_rows = 2 * colc, 2 * colc + 1
    else:
        gate_rows, up_rows = colc, colc + n
    # Prepared row order: per 32-column block b: gate 32 columns, then up 32 columns.
    nb = ip // BLOCK
    rows = torch.stack((gate_rows.reshape(nb, BLOCK), up_rows.reshape(nb, BLOCK)), dim=1).reshape(-1)
    row_live = torch.stack((live.reshape(nb, BLOCK), live.reshape(nb, BLOCK)), dim=1).reshape(-1)
    blocks13 = t["w13_blocks"][:, rows] * row_live.view(1, -1, 1).to(torch.uint8)
    scales13 = t["w13_scales"][:, rows] * row_live.view(1, -1, 1).to(torch.uint8)
    w13, w13_scale = _shuffle_b(blocks13, scales13, hp)
    bias13 = torch.zeros(e, 2 * ip, dtype=torch.float32, device=dev)
    if t["w13_bias"] is not None:
        bias13 = t["w13_bias"][:, rows].float() * row_live.view(1, -1).float()
    # w2: the slice's K columns [0, n), zero codes and scale bytes on the padding.
    blocks2 = torch.zeros(e, hidden, ip // 2, dtype=torch.uint8, device=dev)
    blocks2[:, :, : n // 2] = t["w2_blocks"]
    scales2 = torch.zeros(e, hidden, ip // BLOCK, dtype=torch.uint8, device=dev)
    scales2[:, :, : n // BLOCK] = t["w2_scales"]
    w2, w2_scale = _shuffle_b(blocks2, scales2, ip)
    bias2 = torch.zeros(e, hidden, dtype=torch.float32, device=dev)
    if bias_on:
        bias2 = t["w2_bias"].float().clone()
    return {"w13": w13, "w13_scale": w13_scale, "w13_bias": bias13.contiguous(),
            "w2": w2, "w2_scale": w2_scale, "w2_bias": bias2.contiguous()}


def unshuffle_b(b: torch.Tensor, s: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of the B layouts (for tests): -> codes [E, N, k/2] and scales [E, N, k/32]."""
    e, ng, ks, _, _ = b.shape
    kg = s.shape[2]
    codes = b.reshape(e, ng, ks, 4, 16, 16).permute(0, 1, 4, 2, 3, 5).reshape(e, ng * 16, ks * 64)
    scales = s.reshape(e, ng, kg, 4, 16, 4).permute(0, 1, 4, 2, 5, 3).reshape(e, ng * 16, kg * 16)
    return codes[:, :, : k // 2], scales[:, :, : k // BLOCK]
