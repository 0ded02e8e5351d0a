"""Buffer resources and buffer loads/stores (MUBUF `buffer_load_dwordx4` and friends) for gfx9 / CDNA.

A buffer resource (V#) is a 128-bit scalar descriptor: base address, `num_records` (its size in bytes) and
format flags. A load or store gives a per-lane byte offset (`voffset`, a VGPR). With a raw (stride 0)
descriptor the hardware checks `voffset + instruction offset` against `num_records` for every dword:
out-of-range loads return 0 and out-of-range stores are dropped. The kernels use that as free predication:

- `row_resource(t, row, row_elems)` makes a descriptor whose base is the start of row `row` and whose size is
  exactly that row, so a lane whose vector lies past the end of the row reads zeros and writes nothing.
  `row` must be wave-uniform (block index, or a `readfirstlane`d wave index) so the descriptor stays in SGPRs.
- Keep constant per-slot offsets in `voffset` (never in `soffset`): the scalar offset is not part of the range
  check on gfx9, so putting the slot offset there would defeat the predication.

Offsets here are in bytes, as i32.
"""

from __future__ import annotations

import flydsl.expr as fx
from flydsl.expr import rocdl
from flydsl.expr.typing import T

# One lane moves 16 bytes per access: 8 x bf16, 16 x fp8, 4 x f32.
VEC_BYTES = 16


def _ir(v):
    """A raw ir.Value from a DSL value or a Python int (taken as i32)."""
    if isinstance(v, int):
        return fx.Int32(v).ir_value()
    return fx.as_ir_value(v)


def tensor_resource(t, num_bytes=None):
    """Descriptor over a whole tensor. `num_bytes` (Python int or i32/i64 value) bounds it; None = 4 GiB."""
    ptr = fx.get_iter(t)
    if num_bytes is not None and not isinstance(num_bytes, fx.Int64):
        num_bytes = fx.Int64(num_bytes)
    return rocdl.get_buffer_rsrc(rocdl.make_buffer_ptr(ptr, num_records_bytes=num_bytes))


def row_resource(t, row, row_elems: int, elem_bytes: int):
    """Descriptor over row `row` (wave-uniform) of a row-major tensor with `row_elems` elements per row.

    The descriptor is bounded to the row (`row_elems * elem_bytes` bytes), so lane offsets past the row's end
    are out of range: loads give 0, stores are dropped.
    """
    row_ptr = fx.add_offset(fx.get_iter(t), fx.Int64(row) * row_elems)  # 64-bit: no overflow for huge M
    nbytes = fx.Int64(row_elems * elem_bytes)
    return rocdl.get_buffer_rsrc(rocdl.make_buffer_ptr(row_ptr, num_records_bytes=nbytes))


def load_x4(rsrc, byte_offset):
    """16-byte load (`buffer_load_dwordx4`) -> Vector of 4 x i32."""
    raw = rocdl.raw_ptr_buffer_load(T.i32x4, rsrc, _ir(byte_offset), _ir(0))
    return fx.Vector(raw)


def load_x2(rsrc, byte_offset):
    """8-byte load (`buffer_load_dwordx2`) -> Vector of 2 x i32."""
    raw = rocdl.raw_ptr_buffer_load(T.i32x2, rsrc, _ir(byte_offset), _ir(0))
    return fx.Vector(raw)


def store(value, rsrc, byte_offset):
    """Store a 1/2/4/8/16-byte value (i8, i32, or a vector of i32) at `byte_offset`."""
    rocdl.raw_ptr_buffer_store(_ir(value), rsrc, _ir(byte_offset), _ir(0))


def store_byte(value_i32, rsrc, byte_offset):
    """Store the low byte of an i32 (`buffer_store_byte`)."""
    byte = fx.as_ir_value(fx.Int32(value_i32).to(fx.Int8))
    rocdl.raw_ptr_buffer_store(byte, rsrc, _ir(byte_offset), _ir(0))


def never_in_range():
    """A byte offset beyond any descriptor this module builds (rows are far below 2 GiB)."""
    return fx.Int32(0x7FFFFFF0)


def keep_issued_above():
    """`sched_barrier(0)`: the scheduler may not move any instruction across this point.

    Placed after a batch of loads it keeps them all in flight before the math that follows (otherwise the
    occupancy-driven scheduler may sink loads whose results are needed late, e.g. the weight row).
    """
    rocdl.sched_barrier(0)
