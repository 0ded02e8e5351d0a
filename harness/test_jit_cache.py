"""The compile caches recover from every kind of damage: an artifact is used only if it matches its key.

FlyDSL's disk cache (kernels/jit_cache.py) and the emulator's disassembly cache are each damaged in every
way a crash, a full disk or a careless copy can: truncated, random bytes, a pickle that unpickles but is
not this key's artifact, two artifacts swapped, a lock that is a directory. Each time the kernel is
recompiled (or re-disassembled) with a warning and the result is the right one.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import os
import pickle
import shutil

import pytest

from amd_kernels import jit_cache, warm_up
from harness.isa import code_object_of

PACKAGE = "amd_kernels.norm.rmsnorm_h2880"
KEYS = ("rmsnorm.decode", "rmsnorm.prefill")


@pytest.fixture
def variants(tmp_path, monkeypatch):
    """The two rmsnorm_h2880 variants, compiled into an empty disk cache; each load goes to disk."""
    table = importlib.import_module(PACKAGE).VARIANTS
    monkeypatch.setenv("FLYDSL_RUNTIME_CACHE_DIR", str(tmp_path))
    for key in KEYS:  # fresh in-memory caches (restored after the test)
        monkeypatch.setattr(table.variants[key].launcher, "_mem_cache", {})
        monkeypatch.setattr(table.variants[key].launcher, "cache_manager", None)
    code, files = {}, {}
    for key in KEYS:  # compiled one after the other: each writes one new artifact
        before = set(tmp_path.rglob("*.pkl"))
        code[key] = hashlib.sha256(code_object_of(table._compile(key))).hexdigest()
        (files[key],) = set(tmp_path.rglob("*.pkl")) - before

    def load(key: str, run_only: bool = False):
        launcher = table.variants[key].launcher
        launcher._mem_cache, launcher.cache_manager = {}, None  # forget everything but the disk
        if run_only:
            monkeypatch.setenv("FLYDSL_RUNTIME_RUN_ONLY", "1")
        try:
            return hashlib.sha256(code_object_of(table._compile(key))).hexdigest()
        finally:
            monkeypatch.delenv("FLYDSL_RUNTIME_RUN_ONLY", raising=False)

    return table, code, files, load


def test_artifacts_are_sealed_and_load_from_disk(variants):
    table, code, files, load = variants
    for key in KEYS:
        data = files[key].read_bytes()
        assert jit_cache.unseal(files[key], data) is not None
        assert load(key, run_only=True) == code[key]  # a hit: run-only mode forbids compiling


def _damage(files, how: str) -> None:
    a, b = files[KEYS[0]], files[KEYS[1]]
    data_a, data_b = a.read_bytes(), b.read_bytes()
    if how == "truncated":
        a.write_bytes(data_a[: len(data_a) // 2])
    elif how == "random bytes":
        a.write_bytes(os.urandom(len(data_a)))
    elif how == "empty":
        a.write_bytes(b"")
    elif how == "another key's pickle":  # unpickles into a valid artifact, of the wrong kernel
        a.write_bytes(jit_cache.unseal(b, data_b))
    elif how == "unpickles but is no artifact":
        a.write_bytes(pickle.dumps({"not": "an artifact"}))
    elif how == "resealed under the wrong name":
        a.write_bytes(jit_cache.seal(b, jit_cache.unseal(b, data_b)))
    elif how == "swapped":
        a.write_bytes(data_b)
        b.write_bytes(data_a)
    else:
        raise AssertionError(how)


DAMAGE = ["truncated", "random bytes", "empty", "another key's pickle", "unpickles but is no artifact",
          "resealed under the wrong name", "swapped"]


@pytest.mark.parametrize("how", DAMAGE)
def test_a_damaged_artifact_is_a_miss_and_is_recompiled_with_a_warning(variants, how):
    table, code, files, load = variants
    _damage(files, how)
    with pytest.warns(jit_cache.CorruptCacheArtifact):
        with pytest.raises(RuntimeError, match="RUN_ONLY"):
            load(KEYS[0], run_only=True)  # what warm-up's probe sees: a miss, never the damaged bytes
    with pytest.warns(jit_cache.CorruptCacheArtifact) if how == "swapped" else contextlib.nullcontext():
        assert load(KEYS[0]) == code[KEYS[0]]  # recompiled: the right kernel (its file already deleted)
        assert load(KEYS[1]) == code[KEYS[1]]  # swapped: the other one is recompiled too
    for key in KEYS:
        assert jit_cache.unseal(files[key], files[key].read_bytes()) is not None  # rewritten, sealed


def test_warm_up_recovers_from_a_damaged_artifact(variants):
    """The serving path: warm-up probes, finds the artifact damaged, compiles and loads the right kernel."""
    table, code, files, _ = variants
    _damage(files, "another key's pickle")
    fresh = warm_up.VariantTable(table.module, table.variants)
    for key in KEYS:
        table.variants[key].launcher._mem_cache, table.variants[key].launcher.cache_manager = {}, None
    with pytest.warns(jit_cache.CorruptCacheArtifact):
        report = fresh.warm([KEYS[0]], "test")
    assert report["compiled"] == 1
    assert hashlib.sha256(code_object_of(fresh[KEYS[0]])).hexdigest() == code[KEYS[0]]


@pytest.mark.parametrize("artifact", ["present", "missing"])
def test_a_lock_that_is_a_directory_falls_back_to_a_compile_in_this_process(variants, artifact):
    table, code, files, load = variants
    a = files[KEYS[0]]
    lock = a.with_suffix(".lock")
    if lock.exists():
        lock.unlink()
    lock.mkdir()
    if artifact == "missing":
        a.unlink()
        with pytest.warns(jit_cache.CacheUnavailable):
            assert load(KEYS[0]) == code[KEYS[0]]
    else:
        assert load(KEYS[0], run_only=True) == code[KEYS[0]]  # read without the lock: the seal vouches for it


# --- the emulator's disassembly cache -------------------------------------------------------------------


@pytest.fixture
def disasm(tmp_path, monkeypatch, variants):
    from harness.emulator import decoder

    monkeypatch.setattr(decoder, "BUILD_DIR", tmp_path / "emulator")
    table = variants[0]
    elves = [code_object_of(table._compile(key)) for key in KEYS]
    digests = [hashlib.sha256(e).hexdigest()[:16] for e in elves]
    expected = [[(i.pc, i.text, i.words) for i in decoder.disassemble(e, d)] for e, d in zip(elves, digests)]
    paths = [tmp_path / "emulator" / "disasm" / f"{d}.txt" for d in digests]
    return decoder, elves, digests, expected, paths


@pytest.mark.parametrize("how", ["truncated", "random bytes", "empty", "swapped", "unsealed"])
def test_a_damaged_disassembly_is_redone_with_a_warning(disasm, how):
    decoder, elves, digests, expected, paths = disasm
    a, b = paths
    data_a, data_b = a.read_bytes(), b.read_bytes()
    if how == "truncated":
        a.write_bytes(data_a[: len(data_a) // 2])
    elif how == "random bytes":
        a.write_bytes(os.urandom(len(data_a)))
    elif how == "empty":
        a.write_bytes(b"")
    elif how == "swapped":
        a.write_bytes(data_b)
        b.write_bytes(data_a)
    elif how == "unsealed":  # a listing of the right length but no seal (an older cache, or edited)
        a.write_text(data_a.decode(errors="replace").split(decoder.SEAL)[0])
    with pytest.warns(decoder.CorruptDisassembly):
        got = decoder.disassemble(elves[0], digests[0])
    assert [(i.pc, i.text, i.words) for i in got] == expected[0]
    assert decoder.disassemble(elves[0], digests[0]) is not None  # sealed again: no warning needed
    shutil.rmtree(a.parent)
