"""Read an AMDGPU code object (ELF): per-kernel metadata, kernel descriptor and the .text bytes.

`read_code_object(elf_bytes)` is also what the harness uses for its ISA cards, so it returns plain data:
the msgpack metadata note (amdhsa.kernels[]), the decoded 64-byte kernel descriptor, symbol offsets.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field

import msgpack

NT_AMDGPU_METADATA = 32
STT_FUNC, STT_OBJECT = 2, 1

# kernel_code_properties bits -> number of user SGPRs each enables, in the order the hardware loads them.
_USER_SGPR_FIELDS = (
    (0, "private_segment_buffer", 4),
    (1, "dispatch_ptr", 2),
    (2, "queue_ptr", 2),
    (3, "kernarg_segment_ptr", 2),
    (4, "dispatch_id", 2),
    (5, "flat_scratch_init", 2),
    (6, "private_segment_size", 1),
)


@dataclass
class KernelArg:
    offset: int
    size: int
    value_kind: str
    name: str | None = None


@dataclass
class KernelDescriptor:
    """The 64-byte amdhsa kernel descriptor, with the fields the emulator and ISA cards need decoded."""
    group_segment_fixed_size: int
    private_segment_fixed_size: int
    kernarg_size: int
    entry_offset: int          # kernel_code_entry_byte_offset, relative to the descriptor
    rsrc1: int
    rsrc2: int
    rsrc3: int
    code_properties: int
    kernarg_preload: int

    @property
    def user_sgpr_count(self) -> int:
        return (self.rsrc2 >> 1) & 0x1F

    @property
    def enable_private_segment(self) -> bool:
        return bool(self.rsrc2 & 1)

    @property
    def workgroup_id_enabled(self) -> tuple[bool, bool, bool]:
        return tuple(bool(self.rsrc2 >> b & 1) for b in (7, 8, 9))

    @property
    def workgroup_info_enabled(self) -> bool:
        return bool(self.rsrc2 >> 10 & 1)

    @property
    def vgpr_workitem_ids(self) -> int:
        """0: only x in v0; 1: x, y; 2: x, y, z (packed x | y<<10 | z<<20 in v0 on gfx90a+)."""
        return (self.rsrc2 >> 11) & 3

    @property
    def accum_offset(self) -> int:
        """First unified-register-file row of the AGPRs (gfx90a+: (rsrc3[5:0] + 1) * 4)."""
        return ((self.rsrc3 & 0x3F) + 1) * 4

    @property
    def granulated_vgprs(self) -> int:
        return self.rsrc1 & 0x3F

    @property
    def user_sgprs(self) -> list[tuple[str, int]]:
        """(name, first SGPR) of each user SGPR the hardware initialises."""
        out, n = [], 0
        for bit, name, count in _USER_SGPR_FIELDS:
            if self.code_properties >> bit & 1:
                out.append((name, n))
                n += count
        return out

    @property
    def wave32(self) -> bool:
        return bool(self.code_properties >> 10 & 1)


@dataclass
class Kernel:
    name: str
    symbol: str
    metadata: dict
    descriptor: KernelDescriptor
    entry: int                     # virtual address of the first instruction
    args: list[KernelArg] = field(default_factory=list)

    @property
    def kernarg_segment_size(self) -> int:
        return int(self.metadata.get(".kernarg_segment_size", self.descriptor.kernarg_size))

    @property
    def group_segment_fixed_size(self) -> int:
        return int(self.metadata.get(".group_segment_fixed_size", self.descriptor.group_segment_fixed_size))

    @property
    def private_segment_fixed_size(self) -> int:
        return int(self.metadata.get(".private_segment_fixed_size", self.descriptor.private_segment_fixed_size))

    @property
    def wavefront_size(self) -> int:
        return int(self.metadata.get(".wavefront_size", 64))

    @property
    def vgpr_count(self) -> int:
        return int(self.metadata.get(".vgpr_count", 0))

    @property
    def agpr_count(self) -> int:
        return int(self.metadata.get(".agpr_count", 0))

    @property
    def sgpr_count(self) -> int:
        return int(self.metadata.get(".sgpr_count", 0))


@dataclass
class CodeObject:
    elf: bytes
    digest: str
    e_flags: int
    text: bytes
    text_addr: int
    kernels: dict[str, Kernel]
    symbols: dict[str, int]        # function symbol -> virtual address
    metadata: dict


def _sections(elf: bytes):
    (shoff,) = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    raw = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    strtab = raw[shstrndx]
    names = elf[strtab[4]: strtab[4] + strtab[5]]
    out = {}
    for name_off, typ, flags, addr, off, size, link, info, align, entsize in raw:
        name = names[name_off: names.index(b"\0", name_off)].decode()
        out[name] = dict(type=typ, addr=addr, offset=off, size=size, link=link, entsize=entsize, index=len(out))
    return out, raw


def _symbols(elf: bytes, sections, raw) -> dict[str, tuple[int, int, int]]:
    """name -> (value, size, type) from .symtab (or .dynsym)."""
    sec = sections.get(".symtab") or sections.get(".dynsym")
    if sec is None:
        return {}
    strsec = raw[sec["link"]]
    strings = elf[strsec[4]: strsec[4] + strsec[5]]
    out = {}
    for i in range(sec["size"] // 24):
        name_off, info, other, shndx, value, size = struct.unpack_from("<IBBHQQ", elf, sec["offset"] + 24 * i)
        if name_off:
            name = strings[name_off: strings.index(b"\0", name_off)].decode()
            out[name] = (value, size, info & 0xF)
    return out


def _metadata(elf: bytes, sections) -> dict:
    for name, sec in sections.items():
        if sec["type"] != 7:  # SHT_NOTE
            continue
        pos, end = sec["offset"], sec["offset"] + sec["size"]
        while pos < end:
            namesz, descsz, typ = struct.unpack_from("<III", elf, pos)
            pos += 12
            owner = elf[pos: pos + namesz].rstrip(b"\0")
            pos += (namesz + 3) & ~3
            desc = elf[pos: pos + descsz]
            pos += (descsz + 3) & ~3
            if owner == b"AMDGPU" and typ == NT_AMDGPU_METADATA:
                return msgpack.unpackb(desc, raw=False, strict_map_key=False)
    return {}


def _vaddr_to_offset(sections, vaddr: int) -> int:
    for sec in sections.values():
        if sec["addr"] and sec["addr"] <= vaddr < sec["addr"] + sec["size"] and sec["type"] != 8:  # not NOBITS
            return sec["offset"] + vaddr - sec["addr"]
    raise ValueError(f"address {vaddr:#x} is in no section")


def elf_size(header: bytes) -> int:
    """Size of an ELF image from its 64-byte header (section headers come last in lld's output)."""
    (phoff,) = struct.unpack_from("<Q", header, 0x20)
    (shoff,) = struct.unpack_from("<Q", header, 0x28)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", header, 0x36)
    return max(shoff + shentsize * shnum, phoff + phentsize * phnum)


def read_code_object(elf: bytes) -> CodeObject:
    if elf[:4] != b"\x7fELF":
        raise ValueError("not an ELF code object")
    sections, raw = _sections(elf)
    text = sections[".text"]
    meta = _metadata(elf, sections)
    syms = _symbols(elf, sections, raw)
    (e_flags,) = struct.unpack_from("<I", elf, 0x30)
    kernels = {}
    for km in meta.get("amdhsa.kernels", []):
        kd_name = km[".symbol"]
        kd_addr = syms[kd_name][0]
        off = _vaddr_to_offset(sections, kd_addr)
        f = struct.unpack_from("<IIIIq20xIIIHH4x", elf, off)
        desc = KernelDescriptor(
            group_segment_fixed_size=f[0], private_segment_fixed_size=f[1], kernarg_size=f[2],
            entry_offset=f[4], rsrc3=f[5], rsrc1=f[6], rsrc2=f[7], code_properties=f[8], kernarg_preload=f[9],
        )
        args = [KernelArg(int(a[".offset"]), int(a[".size"]), a.get(".value_kind", ""), a.get(".name"))
                for a in km.get(".args", [])]
        kernels[km[".name"]] = Kernel(km[".name"], kd_name, km, desc, kd_addr + desc.entry_offset, args)
    funcs = {n: v for n, (v, s, t) in syms.items() if t == STT_FUNC}
    return CodeObject(
        elf=elf, digest=hashlib.sha256(elf).hexdigest(), e_flags=e_flags,
        text=elf[text["offset"]: text["offset"] + text["size"]], text_addr=text["addr"],
        kernels=kernels, symbols=funcs, metadata=meta,
    )
