"""What makes translating a code object cheap must not change what it gives.

- decoder's parsed records are reused only when made from the same listing by the same decoder.py and intact
  (a stale or damaged file is parsed again and rewritten);
- _split_top (str.split and rejoining) against a scan of every character;
- parse_operand's memo hands out immutable Operands;
- the collector is back on after a program is made (also when making it fails);
- the words no instruction starts at still jump to a handler naming their pc.
"""

import dataclasses
import gc

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.emulator import decoder
from harness.emulator.operands import parse_operand
from harness.emulator.translate import Context, CounterProxy, Program, gc_paused

DIGEST = "0" * 64
LISTING = """
Disassembly of section .text:

0000000000000100 <k>:
\ts_load_dwordx2 s[4:5], s[0:1], 0x0                         // 000000000100: C0060100 00000000
\ts_cmp_ge_i32 s2, s3                                        // 000000000108: BF030302
\ts_cbranch_scc1 1                                           // 00000000010C: BF850001 <k+0x14>
\tv_max_i32_dpp v1, v1, v1 quad_perm:[2,3,0,1] row_mask:0xf bank_mask:0xf bound_ctrl:1// 000000000110: 1A0202FA FF084E01
\tbuffer_load_dwordx4 v[14:17], v1, s[8:11], 0 offen offset:1024// 000000000118: E05C1400 80020E01
\ts_nop 0                                                    // 000000000120: BF800000
\ts_endpgm                                                   // 000000000124: BF810000
"""
OTHER = LISTING.replace("s_nop 0  ", "s_nop 1  ").replace("BF800000", "BF800001")


def _records(insts):
    return [(i.pc, i.size, i.mnemonic, i.operands, i.mods, i.text, i.words) for i in insts]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """decoder.disassemble over LISTING in a fresh cache; the texts it parses (not unpickles) are recorded."""
    monkeypatch.setattr(decoder, "BUILD_DIR", tmp_path)
    monkeypatch.setattr(decoder, "disassemble_text", lambda path: LISTING)
    parse, parsed = decoder.parse_listing, []
    monkeypatch.setattr(decoder, "parse_listing", lambda text: parsed.append(text) or parse(text))
    want = _records(parse(LISTING))
    assert _records(decoder.disassemble(b"elf", DIGEST)) == want and len(parsed) == 1
    return parsed, tmp_path / "disasm" / f"{DIGEST}.pickle", want, parse


def test_records_are_parsed_once_then_unpickled(cache):
    parsed, path, want, _ = cache
    assert path.exists()
    assert _records(decoder.disassemble(b"elf", DIGEST)) == want
    assert len(parsed) == 1


def test_records_of_another_decoder_are_parsed_again(cache, monkeypatch):
    parsed, _, want, _ = cache
    monkeypatch.setattr(decoder, "SOURCE_HASH", "another decoder.py")
    assert _records(decoder.disassemble(b"elf", DIGEST)) == want and len(parsed) == 2
    assert _records(decoder.disassemble(b"elf", DIGEST)) == want and len(parsed) == 2   # rewritten


def test_records_of_another_listing_are_not_used(cache, tmp_path):
    parsed, _, _, parse = cache
    (tmp_path / "disasm" / f"{DIGEST}.txt").write_text(f"{OTHER}{decoder.SEAL}{decoder._seal_of(DIGEST, OTHER)}\n")
    got = _records(decoder.disassemble(b"elf", DIGEST))
    assert got == _records(parse(OTHER)) and got[-2][2:4] == ("s_nop", ["1"]) and len(parsed) == 2


@pytest.mark.parametrize("how", ["truncated", "empty", "random bytes", "header only", "a payload byte changed",
                                 "hashed but no pickle"])
def test_damaged_records_are_parsed_again_and_rewritten(cache, how):
    parsed, path, want, _ = cache
    data = path.read_bytes()
    if how == "truncated":
        data = data[: len(data) // 2]
    elif how == "empty":
        data = b""
    elif how == "random bytes":
        data = bytes(range(256)) * 8
    elif how == "header only":
        data = data[:128]
    elif how == "a payload byte changed":        # still a valid pickle, of other records
        assert b"s_nop" in data
        data = data.replace(b"s_nop", b"s_nap")
    else:
        payload = b"not a pickle"
        data = data[:64] + decoder.hashlib.sha256(payload).hexdigest().encode() + payload
    path.write_bytes(data)
    assert _records(decoder.disassemble(b"elf", DIGEST)) == want and len(parsed) == 2
    assert _records(decoder.disassemble(b"elf", DIGEST)) == want and len(parsed) == 2   # rewritten


def _scan(s, sep):
    """_split_top as a scan of every character: split at sep where no bracket is open."""
    out, cur, depth = [], "", 0
    for c in s:
        depth += (c in "[(") - (c in "])")
        if depth == 0 and c == sep:
            out, cur = out + [cur], ""
        else:
            cur += c
    return [x.strip() for x in out + [cur] if x.strip()]


@given(st.text(alphabet="v1[](),: |", max_size=40), st.sampled_from([",", " "]))
def test_split_top_is_the_character_scan(s, sep):
    assert decoder._split_top(s, sep) == _scan(s, sep)


def test_operands_are_immutable():
    """parse_operand's memo gives every instruction with a token the same Operand: none may change it."""
    op = parse_operand("-v[4:5]")
    assert op is parse_operand("-v[4:5]") and (op.kind, op.index, op.count, op.neg) == ("v", 4, 2, True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        op.index = 0


@pytest.mark.parametrize("enabled", [True, False])
def test_gc_paused_restores_the_collector(enabled):
    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        with gc_paused():
            assert not gc.isenabled()
        assert gc.isenabled() == enabled
        with pytest.raises(ZeroDivisionError), gc_paused():
            1 / 0
        assert gc.isenabled() == enabled
    finally:
        (gc.enable if was else gc.disable)()


def test_a_jump_between_instructions_names_its_pc():
    prog = Program(decoder.parse_listing(LISTING), Context(acc_offset=0, counters=CounterProxy()), 0x100, 0x2C)
    assert [nxt for _, nxt in prog.table] == [0x108, 0, 0x10C, 0x110, 0x118, 0, 0x120, 0, 0x124, 0x128, 0]
    for pc in (0x104, 0x114, 0x11C, 0x128):
        with pytest.raises(RuntimeError, match=f"jump to pc {pc:#x}, which is not the start of an instruction"):
            prog.table[(pc - 0x100) >> 2][0](None)
