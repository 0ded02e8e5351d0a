"""FlyDSL's disk cache, trusted only where an artifact's contents match its key.

FlyDSL keeps each compiled specialization in FLYDSL_RUNTIME_CACHE_DIR/<function>/<key>.pkl and loads
whatever unpickles under the key's name: another specialization's artifact, or bytes that unpickle into
a wrong object, would be launched (a wrong kernel, or a crash). `install()` (warm-up calls it before any
compile or load) makes the cache check itself:
- every artifact written ends with a seal, MAGIC + sha256(function/key + pickle bytes), after the pickle's
  STOP opcode (pickle.load stops there, so an unpatched FlyDSL still reads these files);
- an artifact is read in full and used only if its seal matches its own name and contents; anything else
  (truncated, random bytes, unsealed, another key's artifact) is deleted with a CorruptCacheArtifact warning
  and FlyDSL compiles it again, as on a miss;
- a lock file FlyDSL cannot take (a directory, no permission, a time-out) or a cache directory it cannot
  create makes that compile run in this process without the disk cache, with a warning, instead of
  failing the call.
Reads need no lock: writers replace files atomically and the seal catches anything else.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import threading
import warnings
from pathlib import Path

MAGIC = b"\0AMDK-SEAL-v1\0"
_DIGEST = 32
_lock = threading.Lock()
_installed = False
_unstored = threading.local()  # .depth > 0: this thread's compiles are not written to the disk cache


class CorruptCacheArtifact(RuntimeWarning):
    """A disk-cache artifact did not match its key; it was deleted and is being recompiled."""


class CacheUnavailable(RuntimeWarning):
    """The disk cache could not be locked or created; the compile ran in this process without it."""


def _name(path: Path) -> bytes:
    return f"{path.parent.name}/{path.stem}".encode()


def seal(path: Path, payload: bytes) -> bytes:
    """The bytes to store at `path`: the pickle, then its seal."""
    return payload + MAGIC + hashlib.sha256(_name(path) + payload).digest()


def unseal(path: Path, data: bytes) -> bytes | None:
    """The pickle bytes of a file read from `path`, or None when the seal is missing or wrong."""
    body, tail = data[: -len(MAGIC) - _DIGEST], data[-len(MAGIC) - _DIGEST:]
    if len(data) < len(MAGIC) + _DIGEST or tail[: len(MAGIC)] != MAGIC:
        return None
    return body if hashlib.sha256(_name(path) + body).digest() == tail[len(MAGIC):] else None


def _reject(path: Path, why: str) -> None:
    warnings.warn(f"FlyDSL cache artifact {path} {why}: deleted, recompiling", CorruptCacheArtifact, stacklevel=4)
    with contextlib.suppress(OSError):
        path.unlink()


def load(path: Path):
    """The artifact stored at `path`, or None (a miss) when there is none or it does not match its key."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as err:
        _reject(path, f"cannot be read ({err})")
        return None
    body = unseal(path, data)
    if body is None:
        _reject(path, "does not match its key (truncated, overwritten, unsealed or another key's artifact)")
        return None
    try:
        return pickle.loads(body)
    except Exception as err:  # noqa: BLE001 - sealed by an incompatible FlyDSL: recompile
        _reject(path, f"does not unpickle ({type(err).__name__}: {err})")
        return None


def check(path: Path) -> None:
    """Delete the artifact at `path` (with a warning) unless its seal matches; a missing file is fine."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return
    except OSError as err:
        _reject(path, f"cannot be read ({err})")
        return
    if unseal(path, data) is None:
        _reject(path, "does not match its key (truncated, overwritten, unsealed or another key's artifact)")


@contextlib.contextmanager
def not_stored():
    """Compiles in this thread inside the block stay out of the disk cache (kept in FlyDSL's memory cache)."""
    _unstored.depth = getattr(_unstored, "depth", 0) + 1
    try:
        yield
    finally:
        _unstored.depth -= 1


def _lock_failure(err: BaseException) -> bool:
    return isinstance(err, OSError) or (isinstance(err, RuntimeError) and str(err).startswith("Timed out waiting"))


def install() -> None:
    """Patch FlyDSL's JitCacheManager once per process (idempotent)."""
    global _installed
    with _lock:
        if _installed:
            return
        from flydsl.compiler import jit_function

        manager = jit_function.JitCacheManager
        original_lock = manager.compile_lock

        def write(cache_file: Path, value) -> None:
            if getattr(_unstored, "depth", 0):
                return
            with jit_function.atomic_write(cache_file, mode="wb") as out:
                out.write(seal(Path(cache_file), pickle.dumps(value)))

        def get(self, cache_key: str):
            if cache_key in self.memory_cache:
                self._hits += 1
                return self.memory_cache[cache_key]
            value = load(self._cache_file(cache_key))
            if value is None:
                self._misses += 1
                return None
            self.memory_cache[cache_key] = value
            self._hits += 1
            return value

        @contextlib.contextmanager
        def compile_lock(self, cache_key: str, *, accept_cached=None):
            check(self._cache_file(cache_key))  # FlyDSL re-reads it under the lock without a check
            held = original_lock(self, cache_key, accept_cached=accept_cached)
            try:
                got = held.__enter__()
            except Exception as err:  # noqa: BLE001 - filtered just below
                if not _lock_failure(err):
                    raise
                warnings.warn(f"FlyDSL cache {self._lock_file(cache_key)} unusable ({err}): compiling in this "
                              "process without the disk cache", CacheUnavailable, stacklevel=3)
                yield None, None
                return
            try:
                yield got
            except BaseException as err:
                if not held.__exit__(type(err), err, err.__traceback__):
                    raise
            else:
                held.__exit__(None, None, None)

        manager._write_cache_file = staticmethod(write)
        manager.get = get
        manager.compile_lock = compile_lock
        _installed = True
