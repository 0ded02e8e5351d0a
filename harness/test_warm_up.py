"""Warm-up compiles every variant in workers before serving; a compile after it is reported."""

from __future__ import annotations

import pytest
import torch

from amd_kernels import compile_watch, warm_up


@pytest.fixture
def rmsnorm_pkg():
    import amd_kernels.norm.rmsnorm_h2880 as pkg

    pkg.rmsnorm.warm_up()
    return pkg


def test_plain_jit_call_after_warm_up_is_an_error_naming_the_call_site(rmsnorm_pkg):
    variant = rmsnorm_pkg.VARIANTS.variants["rmsnorm.decode"]
    with pytest.raises(compile_watch.CompileWhileServingError) as err:
        variant.launcher(*variant.example_args())
    message = str(err.value)
    assert "test_warm_up.py" in message  # the first frame outside amd_kernels and flydsl
    assert "plain @flyc.jit call" in message


def test_a_new_specialization_names_what_changed_in_the_key(rmsnorm_pkg):
    variant = rmsnorm_pkg.VARIANTS.variants["rmsnorm.decode"]
    x, w, out, m, eps = variant.example_args()
    with pytest.raises(compile_watch.CompileWhileServingError) as err:
        variant.launcher(x.to(torch.float16), w, out, m, eps)
    assert "Tensor[torch.bfloat16, rank 2] -> Tensor[torch.float16, rank 2]" in str(err.value)


def test_report_is_a_warning_without_the_error_switch(rmsnorm_pkg, monkeypatch):
    monkeypatch.setenv(compile_watch.ERROR_ENV, "0")
    variant = rmsnorm_pkg.VARIANTS.variants["rmsnorm.decode"]
    with pytest.warns(compile_watch.CompileWhileServing):
        variant.launcher(*variant.example_args())


def test_misses_compile_in_worker_processes_into_the_disk_cache(tmp_path, monkeypatch):
    """A batch of misses goes to the long-lived worker pool, which fills the (here empty) disk cache."""
    import amd_kernels.norm.rmsnorm_h6144 as pkg

    monkeypatch.setenv("FLYDSL_RUNTIME_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(warm_up.WORKERS_ENV, "2")
    monkeypatch.setattr(warm_up, "_pool", None)
    warm_up._compile_in_workers(pkg.VARIANTS, ["rmsnorm.decode", "rmsnorm.prefill"], "test")
    pool = warm_up._pool
    try:
        assert pool is not None and len(pool._procs) == 2
        written = [p for p in tmp_path.rglob("*") if p.is_file()]
        assert len(written) >= 2, written  # one artifact per variant, written by the workers
        with pytest.raises(RuntimeError, match="compile failed"):
            warm_up._compile_in_workers(pkg.VARIANTS, ["no.such.variant"], "test")
    finally:
        if pool is not None:
            pool.close()
        monkeypatch.setattr(warm_up, "_pool", None)


def test_a_dead_compile_worker_is_replaced_and_its_work_done(tmp_path, monkeypatch):
    """A worker that dies (a native crash in the compiler was seen in CI) neither fails the warm-up nor stays
    in the pool: its keys compile in the caller with a warning that says so, and the pool is whole again."""
    import amd_kernels.norm.rmsnorm_h6144 as pkg

    monkeypatch.setenv("FLYDSL_RUNTIME_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(warm_up, "_pool", None)
    # Count the caller's compiles by key (its disk cache cannot tell: this process may hold them in memory).
    in_caller: list[str] = []
    compile_here = pkg.VARIANTS._compile
    monkeypatch.setattr(pkg.VARIANTS, "_compile", lambda key: in_caller.append(key) or compile_here(key))
    pool = warm_up._CompilePool(2)
    try:
        for proc in pool._procs:
            proc.kill()
            proc.wait()
        with pytest.warns(RuntimeWarning, match="compile worker.s. died"):
            pool.compile(pkg.VARIANTS.module, ["rmsnorm.decode", "rmsnorm.prefill"], "test")
        assert sorted(in_caller) == ["rmsnorm.decode", "rmsnorm.prefill"]
        assert len(pool._procs) == 2 and all(p.poll() is None for p in pool._procs)
        with pytest.raises(RuntimeError, match="compile failed"):  # a real compile error still fails
            pool.compile(pkg.VARIANTS.module, ["no.such.variant"], "test")
    finally:
        pool.close()


def _probe_entry(pkg):
    """A fresh entry over the package's table (its own set of warmed modes): returns the mode it ran in."""
    from amd_kernels.norm.rmsnorm_entries import tier

    modes = {"decode": ["rmsnorm.decode"], "prefill": ["rmsnorm.prefill"]}

    @warm_up.entry(pkg.VARIANTS, modes, lambda x: tier(x.shape[0]))
    def probe(x: torch.Tensor) -> str:
        return tier(x.shape[0])

    return probe


DECODE, PREFILL = torch.zeros(4, 1), torch.zeros(1024, 1)


def test_a_first_call_before_any_warm_up_warms_its_mode_silently(rmsnorm_pkg):
    compile_watch.disarm()  # the fixture's warm-up armed the report: start a new session
    probe = _probe_entry(rmsnorm_pkg)
    with compile_watch.recording() as events:
        assert probe(PREFILL) == "prefill"
    assert compile_watch.serving_compiles(events) == []


def test_a_lazy_warm_up_after_a_warm_up_is_an_error_naming_the_call_site(rmsnorm_pkg):
    probe = _probe_entry(rmsnorm_pkg)
    probe.warm_up("decode")
    assert probe(DECODE) == "decode"  # the warmed mode serves without a report
    with pytest.raises(compile_watch.CompileWhileServingError) as err:
        probe(PREFILL)
    message = str(err.value)
    assert "probe [prefill]" in message and "lazy warm-up" in message
    assert "test_warm_up.py" in message  # the caller's line, not a frame inside amd_kernels


def test_a_lazy_warm_up_of_a_sibling_entry_is_reported_as_a_warning(rmsnorm_pkg, monkeypatch):
    """After one entry's warm-up, the first call of another entry never warmed is reported too."""
    monkeypatch.setenv(compile_watch.ERROR_ENV, "0")
    _probe_entry(rmsnorm_pkg).warm_up()
    sibling = _probe_entry(rmsnorm_pkg)
    with compile_watch.recording() as events, pytest.warns(compile_watch.CompileWhileServing, match="probe \\[decode\\]"):
        assert sibling(DECODE) == "decode"
    assert [e.function for e in compile_watch.serving_compiles(events)] == ["probe [decode]"]
    with compile_watch.recording() as events:
        sibling(DECODE)  # reported once: the mode is warm now
    assert compile_watch.serving_compiles(events) == []


# A variant whose code object changes when LLVM's lsr-drop-solution is false (24 of our 85 do: stop 44).
SENSITIVE = ("amd_kernels.attention.paged_q8_kv1_d64", "window")


def test_llvm_options_another_compile_left_do_not_reach_our_code_objects(request, tmp_path, monkeypatch):
    """After another kernel's compile with LLVM options (FlyDSL's restore leaves `lsr-drop-solution`
    explicitly false, kernels/llvm_state.py), a compile here would give another code object under the usual
    cache key; the warm-up sees it and compiles in a worker, whose code object is a clean process's."""
    import hashlib
    import importlib

    import flydsl.compiler as flyc
    from flydsl.compiler.llvm_options import llvm_options

    from amd_kernels import llvm_state
    from harness import own_process
    from harness.isa import code_object_of

    if not own_process.runs_here(request):  # the option stays changed in the process that sets it
        return
    table = importlib.import_module(SENSITIVE[0]).VARIANTS
    key = SENSITIVE[1]
    variant = table.variants[key]

    def compiled_with_empty_caches(name: str, how) -> str:
        monkeypatch.setenv("FLYDSL_RUNTIME_CACHE_DIR", str(tmp_path / name))
        monkeypatch.setattr(variant.launcher, "_mem_cache", {})
        monkeypatch.setattr(variant.launcher, "cache_manager", None)
        table._loaded.pop(key, None)
        return hashlib.sha256(code_object_of(how())).hexdigest()

    clean = compiled_with_empty_caches("clean", lambda: table._compile(key))
    assert not llvm_state.changed(), "compiling our variant set an LLVM option"
    with llvm_options({"lsr-drop-solution": True}):  # what FlyDSL does around a hinted compile
        pass
    assert llvm_state.changed()
    unguarded = compiled_with_empty_caches("unguarded", lambda: flyc.compile(variant.launcher, *variant.example_args()))
    assert unguarded != clean, "FlyDSL's restore no longer changes later compiles: llvm_state's guard may go"
    monkeypatch.setenv(warm_up.WORKERS_ENV, "1")
    monkeypatch.setattr(warm_up, "_pool", None)
    try:
        guarded = compiled_with_empty_caches("guarded", lambda: table[key])
        assert warm_up._pool is not None, "the compile did not go to a worker"
    finally:
        if warm_up._pool is not None:
            warm_up._pool.close()
    assert guarded == clean
    artifacts = list((tmp_path / "guarded").rglob("*.pkl"))
    assert len(artifacts) == 1, artifacts  # written by the worker, loaded here
    # Where no worker can compile (a table no worker can import; workers that died): compiled here, said,
    # and kept out of the disk cache.
    adhoc = warm_up.VariantTable("harness.not_importable_by_name", {key: variant})
    with pytest.warns(llvm_state.LLVMOptionsChanged, match=key):
        assert compiled_with_empty_caches("here", lambda: adhoc[key]) == unguarded
    assert not list((tmp_path / "here").rglob("*.pkl"))
