"""Several emulated GPUs: one rank per process, sharing the memory they exchange through IPC.

    from harness.emulator import ranks
    results = ranks.run(worker, world=8, args=(...,), timeout=600)   # worker(rank, world, *args) -> picklable

Each rank is a process (torch.multiprocessing, forked from a fork server that imported torch; it takes the
caller's environment at `run`) with its own emulated device and a gloo process group
(`torch.distributed` is initialized before `worker` runs, so communicators can exchange IPC handles over
it). Device memory comes from the substitute HIP runtime (hip_shim.c) as memfd-backed shared mappings:
hipIpcGetMemHandle / hipIpcOpenMemHandle map the same pages into a peer, so every rank's emulated loads
and stores reach them.

What the emulator does for multi-GPU code (the hooks below, called from ops_scalar / ops_memory):
- System-scope (`sc1`) global and buffer atomics are real CPU atomics on the shared pages
  (`emuAtomicRmw32` in the shim), so they are atomic across rank processes. Plain loads and stores of
  aligned dwords are single CPU accesses; x86 keeps stores in program order (TSO), which is at least as
  strong as the release/acquire pairs the kernels use.
- `s_sleep` yields the CPU (the ranks share two cores: a spinning rank must let the others run) and is
  where a hang is caught: a wave that keeps sleeping for longer than the timeout
  (AMD_KERNELS_RANK_TIMEOUT seconds, default 120) while the system-scope flag it polls neither changes
  nor is replaced by another flag stops the launch with a RankHang naming the rank,
  workgroup, wave, PC and the last system-scope flag load of that wave (address and value read).
  A spin loop without `s_sleep` still progresses, but only the process-level alarm of `run` catches it.
- The emulator runs one workgroup at a time, so a kernel whose workgroup b waits for the peers' workgroup b
  needs every rank to run its workgroups in the same order: `run` gives every rank the same workgroup-order
  seed. (On a GPU all workgroups of such a kernel are resident at once; this is a property of the emulator,
  not of the kernel.)

What it cannot see: the memory model is the CPU's, so a kernel that reads a peer's buffer before the flag
publishing it, or that omits the release fence before a flag store, can still pass here when the data
happened to be there; the sanitizer's uninitialized-read check only catches a read of bytes nobody wrote.
"""

from __future__ import annotations

import ctypes
import datetime
import os
import resource
import signal
import tempfile
import time
import traceback

import numpy as np

TIMEOUT_ENV = "AMD_KERNELS_RANK_TIMEOUT"
DEFAULT_TIMEOUT = 120.0
# Whole-process allowance beyond the hang timeout: 8 processes importing torch and FlyDSL, loading kernels
# and running cases on 2 shared cores.
ALARM_SLACK = 600

# What the rank processes' fork server imports once, so that no rank pays it: torch (8 spawned ranks each
# importing it cost 16 CPU-s a run), torch._dynamo (imported by a rank's first custom-op call: ~1.7 CPU-s a
# rank) and FlyDSL's compiler. Only third-party modules whose imports read no switch of ours: a module of
# this repository imported here would keep the fork server's environment, not the caller's at run().
PRELOAD = ("torch", "numpy", "torch._dynamo", "flydsl.compiler")

_rank = None             # this process's rank when run() started it
_timeout = None          # seconds a wave may keep sleeping before it is a hang
_ranks_cpu = 0.0         # CPU seconds the rank processes run() started here reported (they are not its children)
_waiting: dict = {}      # (workgroup, wave) of the current launch -> [wait start, last flag address, value]
_waiting_launch = [None]  # the launch _waiting belongs to (the object itself: an id() is reused once freed)


class RankHang(RuntimeError):
    """A wave waited on a flag (kept executing s_sleep) for longer than the timeout."""


class RankFailed(RuntimeError):
    """A rank process raised, died, or did not finish in time; the message names the rank."""


def timeout() -> float:
    if _timeout is not None:
        return _timeout
    return float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT))


def rank() -> int | None:
    return _rank


# ---- hooks called by the instruction builders --------------------------------------------------------

def _wait_entry(w):
    if _waiting_launch[0] is not w.launch:
        _waiting.clear()
        _waiting_launch[0] = w.launch
    return _waiting.setdefault((w.wg_id, w.wave_id), [None, None, None])


def build_sleep(inst):
    """`s_sleep`: yield the CPU to the other ranks; past the timeout, raise RankHang."""

    def h(w):
        entry = _wait_entry(w)
        now = time.monotonic()
        if entry[0] is None:
            entry[0] = now
        waited = now - entry[0]
        if waited > timeout():
            flag = ("no system-scope load seen" if entry[1] is None
                    else f"last system-scope load {entry[1]:#x} read {entry[2]} ({entry[2]:#x})")
            who = f"rank {_rank}" if _rank is not None else "this process"
            raise RankHang(f"{who}: workgroup {w.wg_id} wave {w.wave_id} kept waiting for {waited:.0f} s "
                           f"(> {timeout():.0f} s, {TIMEOUT_ENV}); {flag}")
        if waited > 0.01:
            time.sleep(0.001)
        else:
            os.sched_yield()
        return None

    return h


def watch_flag_load(h, address, lanes):
    """Wrap a system-scope (`sc1`) global load: remember its first active lane's address and value, for
    the hang report. `address(w)` gives the lane addresses, `lanes(w)` the active-lane mask."""

    def watched(w):
        r = h(w)
        act = lanes(w)
        addrs = np.broadcast_to(address(w), act.shape)[act]
        if len(addrs):
            a = int(addrs[0])
            entry = _wait_entry(w)
            value = ctypes.c_uint32.from_address(a).value
            if (a, value) != (entry[1], entry[2]):
                entry[0] = None  # progress (another flag, or this one moved): the wait clock starts again
            entry[1], entry[2] = a, value
        return r

    return watched


_lib = None
_OPS = {"add": 0, "add_u32": 0, "swap": 1, "wrxchg_b32": 1, "cmpswap": 2, "or": 3, "or_b32": 3}


def system_rmw(inst, what):
    """For a system-scope (`sc1`) 32-bit atomic that the shim implements: an `_atomic_rmw` replacement
    doing real CPU atomics (atomic across rank processes). None otherwise (keep the emulator's own)."""
    if "sc1" not in inst.mods or what not in _OPS:
        return None
    global _lib
    if _lib is None:
        from . import shim

        _lib = shim.load()
        _lib.emuAtomicRmw32.restype = ctypes.c_uint32
        _lib.emuAtomicRmw32.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_uint32]
    code = _OPS[what]
    fn = _lib.emuAtomicRmw32

    def rmw(read_one, write_one, addrs, vals, op, cmp=None):
        olds = np.zeros(len(addrs), np.uint32)
        for i, a in enumerate(addrs.tolist()):
            olds[i] = fn(a, code, int(vals[i]), int(cmp[i]) if cmp is not None else 0)
        return olds

    return rmw


# ---- the rank processes ------------------------------------------------------------------------------

class _Alarm(BaseException):
    pass


def _worker(rank_, world, init_file, fn, args, seed, out_dir, timeout_s, where):
    global _rank, _timeout
    _rank, _timeout = rank_, timeout_s
    out = os.path.join(out_dir, f"rank{rank_}.pkl")
    env, cwd = where
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    try:
        os.environ["AMD_KERNELS_DEVICE"] = "emulator"
        from harness import emulator

        emulator.install()
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank_, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout_s * 3 + 60))

        def on_alarm(signum, frame):
            raise RankHang(f"rank {rank_}: still running after {ALARM_SLACK + 2 * timeout_s:.0f} s (a spin loop "
                           f"without s_sleep, or a host-side wait)\n" + "".join(traceback.format_stack(frame)))

        signal.signal(signal.SIGALRM, on_alarm)
        signal.alarm(int(ALARM_SLACK + 2 * timeout_s))
        # One workgroup order for every rank (see the module docstring); the wave interleaving may differ.
        with emulator.options(workgroup_order_seed=seed):
            result = fn(rank_, world, *args)
        signal.alarm(0)
        payload = ("ok", result)
    except BaseException as e:  # noqa: BLE001 - reported to the parent with the rank
        signal.alarm(0)
        payload = ("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
    import torch  # torch.save: plain pickle cannot carry float8 tensors

    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime  # its compile workers included
    torch.save((*payload, cpu), out + ".tmp")
    os.replace(out + ".tmp", out)
    try:
        import torch.distributed as dist

        if dist.is_initialized() and payload[0] == "ok":
            dist.barrier()  # keep every rank's IPC mappings alive until all ranks are done
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - the result is already written
        pass


def _add_cpu(seconds: float) -> None:
    global _ranks_cpu
    _ranks_cpu += seconds


def ranks_cpu_seconds() -> float:
    """CPU seconds of every rank process run() started in this process so far (forkserver children are not
    this process's children, so RUSAGE_CHILDREN leaves them out; harness/memory.clock adds this)."""
    return _ranks_cpu


def run(fn, world: int = 8, args: tuple = (), timeout: float | None = None, seed: int | None = 0) -> list:
    """Run fn(rank, world, *args) in `world` rank processes; return their results in rank order.

    `timeout` is the hang timeout of the ranks' waits (default AMD_KERNELS_RANK_TIMEOUT or 120 s); a rank
    process still running ALARM_SLACK + 2 x timeout seconds after it started is stopped by an alarm.
    Raises RankFailed naming the rank(s) that raised (with their traceback), died, or gave no result.
    `seed` is the workgroup-order seed every rank uses.
    """
    import torch
    import torch.multiprocessing as mp

    t = timeout if timeout is not None else float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT))
    # Forked from a fork server that imported PRELOAD once; each rank then takes this process's environment
    # and directory as of now, as a spawned one would.
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))
    where = (dict(os.environ), os.getcwd())
    with tempfile.TemporaryDirectory(prefix="amdk-ranks-") as tmp:
        init_file = os.path.join(tmp, "pg")
        procs = [ctx.Process(target=_worker, args=(r, world, init_file, fn, args, seed, tmp, t, where), daemon=True)
                 for r in range(world)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + 3 * t + ALARM_SLACK + 60
        paths = [os.path.join(tmp, f"rank{r}.pkl") for r in range(world)]
        while time.monotonic() < deadline:
            if all(os.path.exists(x) or not p.is_alive() for x, p in zip(paths, procs)):
                break
            time.sleep(0.2)
        for p in procs:
            p.join(5)  # the ranks that finished leave their closing barrier together
        results, problems = [], []
        for r, p in enumerate(procs):
            path = os.path.join(tmp, f"rank{r}.pkl")
            if os.path.exists(path):
                status, value, cpu = torch.load(path, weights_only=False)
                _add_cpu(cpu)
                if status == "ok":
                    results.append(value)
                    continue
                problems.append(f"rank {r}: {value}")
            elif p.is_alive():
                problems.append(f"rank {r}: no result after {3 * t + ALARM_SLACK + 60:.0f} s")
            else:
                problems.append(f"rank {r}: process exited with code {p.exitcode} and no result")
            results.append(None)
        for p in procs:
            if p.is_alive():
                p.kill()  # only the processes started here
                p.join(5)
        if problems:
            raise RankFailed("\n".join(problems))
        return results
