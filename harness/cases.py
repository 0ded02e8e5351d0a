"""Cases the harness runs: every (kernel package, op, dims) a regime serves, at every token count."""

from __future__ import annotations

import json
from dataclasses import dataclass

from harness import discovery, regimes


@dataclass(frozen=True)
class OpShape:
    """One op at one shape, served by one kernel package, merged over regimes and TP sizes."""

    kernel: str
    op: str
    dims_json: str
    token_counts: tuple  # regimes.TokenCount, merged over regimes
    served_by: tuple  # "regime tp<n>" labels

    @property
    def dims(self) -> dict:
        return json.loads(self.dims_json)

    @property
    def id(self) -> str:
        return f"{self.kernel}:{self.op}"


def op_shapes(selected_regimes: list[str] | None = None) -> list[OpShape]:
    merged: dict[tuple, dict] = {}
    for name, ops in regimes.all_regimes().items():
        if selected_regimes and name not in selected_regimes:
            continue
        for rop in ops:
            key = (rop.kernel, rop.op, json.dumps(rop.dims, sort_keys=True))
            slot = merged.setdefault(key, {"counts": {}, "served": []})
            for c in rop.token_counts:
                slot["counts"][(c.tokens, c.real)] = c
            slot["served"] += [f"{name} tp{tp}" for tp in rop.tp]
    return [
        OpShape(k, op, dims, tuple(sorted(v["counts"].values(), key=lambda c: (c.tokens, c.real))), tuple(v["served"]))
        for (k, op, dims), v in sorted(merged.items())
    ]


def validate() -> list[str]:
    """Problems in the regimes or declarations: an op with no package or no reference, an unknown entry, an
    [emulator.op_*] table naming an op no entry implements."""
    from references import OPS

    problems = []
    packages = discovery.discover()
    for shape in op_shapes():
        pkg = packages.get(shape.kernel)
        if pkg is None:
            problems.append(f"{shape.id}: no kernel package kernels/{shape.kernel}/kernel.toml")
            continue
        if shape.op not in OPS:
            problems.append(f"{shape.id}: no reference for op {shape.op!r} in references/")
        if shape.op not in pkg.entries.values():
            problems.append(f"{shape.id}: kernels/{shape.kernel} declares no entry for op {shape.op!r}")
    for pkg in packages.values():
        for entry, op in pkg.entries.items():
            if op not in OPS:
                problems.append(f"kernels/{pkg.path}: entry {entry} names op {op!r} with no reference")
        if not pkg.readme.is_file():
            problems.append(f"kernels/{pkg.path}: no README.md")
        for table, ops in (("op_token_counts", pkg.emulator_op_token_counts),
                           ("op_invariance_counts", pkg.emulator_op_invariance_counts),
                           ("op_sample_above_tokens", pkg.emulator_op_sample_above_tokens)):
            for op in set(ops) - set(pkg.entries.values()):  # a misspelt op would silently get the default
                problems.append(f"kernels/{pkg.path}: [emulator.{table}] names {op!r}, no entry's op")
    return problems
