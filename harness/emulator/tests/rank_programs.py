"""Programs the multi-rank emulator tests run in each rank process (importable by spawned workers)."""

from __future__ import annotations

import ctypes

WORLD = 4
SLOTS = 1024  # int32 slots of each rank's signal page
COUNTER = 64  # slot of rank 0's page that every rank atomically increments


class IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * 64)]


def _hip():
    lib = ctypes.CDLL("libamdhip64.so.7")  # the shim, already loaded by install()
    lib.hipIpcOpenMemHandle.argtypes = [ctypes.POINTER(ctypes.c_void_p), IpcHandle, ctypes.c_uint]
    return lib


def shared_pages(rank, world):
    """Each rank's signal page mapped in this process (own one from hipMalloc, peers' through IPC)."""
    import torch
    import torch.distributed as dist

    lib = _hip()
    own = ctypes.c_void_p()
    assert lib.hipMalloc(ctypes.byref(own), SLOTS * 4) == 0
    ctypes.memset(own, 0, SLOTS * 4)
    handle = IpcHandle()
    assert lib.hipIpcGetMemHandle(ctypes.byref(handle), own) == 0
    handles = [None] * world
    dist.all_gather_object(handles, bytes(handle))
    ptrs = []
    for r, hb in enumerate(handles):
        if r == rank:
            ptrs.append(own.value)
            continue
        h = IpcHandle.from_buffer_copy(hb)
        p = ctypes.c_void_p()
        assert lib.hipIpcOpenMemHandle(ctypes.byref(p), h, 1) == 0, f"open rank {r}'s handle"
        ptrs.append(p.value)
    tensors = [torch.frombuffer((ctypes.c_int32 * SLOTS).from_address(p), dtype=torch.int32) for p in ptrs]
    dist.barrier()
    return tensors


def _kernels():
    import flydsl.compiler as flyc
    import flydsl.expr as fx
    from flydsl.expr import rocdl

    acq, rel = fx.AtomicOrdering.Acquire, fx.AtomicOrdering.Release

    def at(t, i):
        return fx.add_offset(fx.get_iter(t), fx.Int64(i))

    @flyc.kernel(name="rank_flag_exchange", known_block_size=[64, 1, 1])
    def exchange(p0: fx.Tensor, p1: fx.Tensor, p2: fx.Tensor, p3: fx.Tensor, me: fx.Tensor, rank: fx.Int32,
                 epoch: fx.Int32):
        # publish: peer p's slot [rank] = epoch; count on rank 0's page with a system-scope atomic add
        for p in (p0, p1, p2, p3):
            fx.generic_store(at(p, rank), epoch, memory_order=rel, syncscope="one-as")
        fx.atomic_add(at(p0, COUNTER), fx.Int32(1), syncscope="one-as")
        # wait for every peer's slot on my page
        for r in range(WORLD):
            v = fx.generic_load(at(me, r), memory_order=acq, syncscope="one-as")
            while v != epoch:
                rocdl.s_sleep(2)
                v = fx.generic_load(at(me, r), memory_order=acq, syncscope="one-as")

    @flyc.jit
    def launch(p0: fx.Tensor, p1: fx.Tensor, p2: fx.Tensor, p3: fx.Tensor, me: fx.Tensor, rank: fx.Int32,
               epoch: fx.Int32):
        exchange(p0, p1, p2, p3, me, rank, epoch).launch(grid=(1, 1, 1), block=(64, 1, 1))

    return launch


def flag_exchange(rank, world, absent_rank=None, rounds=2, stagger=0.0):
    """Every rank publishes a flag to every peer and waits for all; rank `absent_rank` never launches.
    From the second round on, rank r launches `stagger` x r seconds late (its peers wait that long)."""
    import time

    import torch.distributed as dist

    pages = shared_pages(rank, world)
    launch = _kernels()
    if rank == absent_rank:
        return None
    for epoch in range(1, rounds + 1):
        if epoch > 1:
            time.sleep(stagger * rank)
        launch(*pages, pages[rank], rank, epoch)
    seen = pages[rank][:world].tolist()
    dist.barrier()  # every rank's atomic adds are done
    return {"flags": seen, "counter": int(pages[0][COUNTER])}


def preloaded(rank, world, names):
    """Which of `names` this rank process had imported before its program started (the fork server's)."""
    import sys

    return {n: n in sys.modules for n in names}
