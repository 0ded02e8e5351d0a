"""Disassemble a code object's .text with Debian llvm-22's llvm-objdump into per-PC instruction records.

The disassembly text is cached per code-object hash in .cache/emulator/disasm/, sealed with a hash of the
code-object hash and the text; a file whose seal does not match is redone with a warning. Each record keeps the
mnemonic, positional operands and the space-separated modifiers exactly as LLVM prints them; translate.py
turns each record into an executable closure once. The records are cached too (pickled next to the listing,
used only when made from that listing by this decoder.py and their bytes match their hash; else parsed again).
"""

from __future__ import annotations

import hashlib
import os
import pickle
import re
import subprocess
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from harness.toolchain import find_system_tool

from .shim import BUILD_DIR

# Modifier words that LLVM prints without a colon after the last positional operand.
FLAG_WORDS = {
    "offen", "idxen", "glc", "slc", "nt", "sc0", "sc1", "lds", "clamp", "gds", "tfe", "lwe", "addr64",
    "row_mirror", "row_half_mirror", "nv",
}

_TARGET = re.compile(r"\s*<[^>]*>\s*$")   # a branch target's annotation
_LINE = re.compile(r"^\s+(\S+)(.*?)\s*//\s*([0-9A-Fa-f]+):((?:\s+[0-9A-Fa-f]{8})+)")


@dataclass
class Inst:
    pc: int                      # virtual address
    size: int                    # bytes
    mnemonic: str
    operands: list[str]
    mods: dict = field(default_factory=dict)   # name -> value string (True for flag words)
    text: str = ""
    words: tuple = ()                          # raw 32-bit instruction words

    def __str__(self):
        return self.text


def _split_top(s: str, sep: str) -> list[str]:
    """Split on the one-character `sep` outside brackets/parentheses."""
    out, depth = [], 0
    for piece in s.split(sep):
        if depth:                       # this sep was inside brackets: the piece continues the last part
            out[-1] = f"{out[-1]}{sep}{piece}"
        else:
            out.append(piece)
        depth += piece.count("[") + piece.count("(") - piece.count("]") - piece.count(")")
    return [x.strip() for x in out if x.strip()]


def _is_modifier(tok: str) -> bool:
    return tok in FLAG_WORDS or (":" in tok and not tok.startswith(("v[", "s[", "a[", "ttmp[")))


def parse_line(mnemonic: str, rest: str) -> tuple[list[str], dict]:
    rest = _TARGET.sub("", rest.strip())
    if mnemonic == "s_waitcnt":
        return [rest], {}
    parts = _split_top(rest, ",")
    operands, mods = [], {}
    if parts:
        words = _split_top(parts[-1], " ")
        parts = parts[:-1] + words[:1]
        tail = words[1:]
        for p in parts:
            if _is_modifier(p):
                tail.insert(0, p)
            else:
                operands.append(p)
        for t in tail:
            if ":" in t:
                k, v = t.split(":", 1)
                mods[k] = v
            else:
                mods[t] = True
    return operands, mods


def disassemble_text(elf_path: str) -> str:
    objdump = find_system_tool("llvm-objdump")
    if objdump is None:
        raise RuntimeError("llvm-objdump-22 not found: install Debian's llvm-22 (llvm-19 does not know gfx950)")
    return subprocess.run([objdump, "-d", "--mcpu=gfx950", elf_path], check=True, capture_output=True,
                          text=True).stdout


SEAL = "\n// amd_kernels disasm seal "  # a comment line parse_listing skips


class CorruptDisassembly(RuntimeWarning):
    """A cached disassembly did not match its code object; it was redone."""


def _seal_of(digest: str, text: str) -> str:
    return hashlib.sha256(f"{digest}\n{text}".encode()).hexdigest()


def _cached_text(txt_path, digest: str) -> str | None:
    """The cached listing if its seal matches this code object's digest and the text, else None."""
    try:
        text, sep, seal = txt_path.read_text().rpartition(SEAL)
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError):
        sep = ""
    if sep and seal.strip() == _seal_of(digest, text):
        return text
    warnings.warn(f"disassembly cache {txt_path} does not match its code object: redoing it", CorruptDisassembly,
                  stacklevel=3)
    return None


def disassemble(elf: bytes, digest: str) -> list[Inst]:
    cache_dir = BUILD_DIR / "disasm"
    cache_dir.mkdir(parents=True, exist_ok=True)
    txt_path = cache_dir / f"{digest}.txt"
    text = _cached_text(txt_path, digest)
    if text is None:
        elf_path = cache_dir / f"{digest}.{os.getpid()}.elf"
        elf_path.write_bytes(elf)
        try:
            text = disassemble_text(str(elf_path))
        finally:
            elf_path.unlink(missing_ok=True)
        _write(txt_path, f"{text}{SEAL}{_seal_of(digest, text)}\n".encode())
    return _parsed(cache_dir / f"{digest}.pickle", _seal_of(digest, text), text)


def _write(path, data: bytes) -> None:
    """Atomically: a process reading the cache sees the old file or the new one."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


# the decoder's source: records parsed by another decoder.py are not reused
SOURCE_HASH = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()


def _parsed(path, seal: str, text: str) -> list[Inst]:
    """parse_listing(text), unpickled from path when that file was made from this listing (its seal) by this
    decoder and its payload matches its hash; else parsed and the file rewritten, with no warning (every edit
    of decoder.py makes every file stale; every process that runs a code object parses it: the MoE entry's 3
    listings 0.18 CPU-s, from here 0.06)."""
    key = hashlib.sha256(f"{SOURCE_HASH}\n{seal}".encode()).hexdigest().encode()
    try:
        data = path.read_bytes()
        if data[:64] == key and data[64:128] == hashlib.sha256(data[128:]).hexdigest().encode():
            return pickle.loads(data[128:])
    except Exception:  # noqa: BLE001 - missing, unreadable or not a pickle: parsed again
        pass
    insts = parse_listing(text)
    payload = pickle.dumps(insts, pickle.HIGHEST_PROTOCOL)
    try:
        _write(path, key + hashlib.sha256(payload).hexdigest().encode() + payload)
    except OSError:  # a full disk or a read-only cache: the records are parsed, the file only saves a parse
        pass
    return insts


def parse_listing(text: str) -> list[Inst]:
    out = []
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        mnemonic, rest, addr, words = m.groups()
        operands, mods = parse_line(mnemonic, rest)
        size = 4 * len(words.split())
        raw = tuple(int(x, 16) for x in words.split())
        out.append(Inst(int(addr, 16), size, mnemonic, operands, mods, f"{mnemonic}{rest}".strip(), raw))
    return out
