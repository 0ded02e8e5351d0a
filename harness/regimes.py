"""Served regimes (regimes/<model>.toml): which op runs at which shape token and token counts.

Token counts: decode runs at vLLM's CUDA-graph capture sizes (a real batch of n rows runs at the next
capture size, the padding rows holding garbage); prefill runs at the listed chunk sizes with no padding.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from harness.toolchain import REPO

REGIMES_DIR = REPO / "regimes"


@dataclass(frozen=True)
class TokenCount:
    tokens: int  # rows the kernel runs (a capture size, or a prefill chunk)
    real: int  # rows holding real tokens; rows real..tokens-1 are graph padding
    phase: str  # "decode" or "prefill"


@dataclass(frozen=True)
class RegimeOp:
    regime: str
    op: str
    kernel: str  # "<category>/<shape token>"
    tp: tuple[int, ...]
    dims: dict
    token_counts: tuple[TokenCount, ...]

    @property
    def label(self) -> str:
        return f"{self.regime}:{self.kernel}:{self.op}"


def capture_sizes(spec: dict) -> list[int]:
    sizes = list(spec["first"])
    step, last = int(spec["step"]), int(spec["last"])
    sizes += range(step, last + 1, step)
    if sizes != sorted(set(sizes)):
        raise ValueError(f"decode_token_counts: capture sizes are not increasing: {spec}")
    return sizes


def token_counts(serving: dict) -> tuple[TokenCount, ...]:
    """Each capture size runs with the most padding it can see: previous size + 1 real rows."""
    if serving.get("padding") != "next_capture_size":
        raise ValueError(f"serving.padding: unknown rule {serving.get('padding')!r}")
    sizes = capture_sizes(serving["decode_token_counts"])
    counts = [TokenCount(s, (prev + 1) if prev else s, "decode") for prev, s in zip([0, *sizes], sizes)]
    counts += [TokenCount(int(t), int(t), "prefill") for t in serving["prefill_token_counts"]]
    return tuple(counts)


def load(path: Path | str) -> list[RegimeOp]:
    path = Path(path)
    data = tomllib.loads(path.read_text())
    counts = token_counts(data["serving"])
    served_tp = set(data["serving"]["tensor_parallel"])
    ops = []
    for entry in data.get("ops", []):
        tp = tuple(entry.get("tp", sorted(served_tp)))
        if not set(tp) <= served_tp:
            raise ValueError(f"{path.name}: op {entry['op']} lists tp {tp} outside serving {sorted(served_tp)}")
        # `phases = ["decode"]`: an op whose kernels serve only some phases so far runs only their counts.
        phases = set(entry.get("phases", ("decode", "prefill")))
        op_counts = tuple(c for c in counts if c.phase in phases)
        ops.append(RegimeOp(path.stem, entry["op"], entry["kernel"], tp, dict(entry["dims"]), op_counts))
    return ops


def all_regimes() -> dict[str, list[RegimeOp]]:
    return {p.stem: load(p) for p in sorted(REGIMES_DIR.glob("*.toml"))}
