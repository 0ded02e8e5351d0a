"""`harness run`'s progress on stderr: a bar over the cases, what runs now, elapsed time and time left.

The estimate of the time left adds up, for each warm-up and case still to come, its time in the last run
(kept in .cache/run_times.json, so a second run estimates well from the start) or, for one never timed, the
mean of the same op shape's cases (else of every case), this run's, else the last run's. Results go to stdout
through `out`, which lifts the bar off the terminal line first.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import zlib

from harness.toolchain import CACHE

TIMES = CACHE / "run_times.json"
WIDTH = 30  # bar characters


def _shape_key(shape_id: str, dims_json: str) -> str:
    return f"{shape_id}/{zlib.crc32(dims_json.encode()):08x}"  # one op has several shapes (attention)


def clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 else \
        f"{seconds // 60}:{seconds % 60:02d}"


class Progress:
    """shapes: [(shape id, dims json, [(tokens, real)])] in the order they run; executing: cases run
    (else only warm-ups); jobs: how many cases run at once (the estimate divides the cases' time by it)."""

    def __init__(self, shapes: list, executing: bool = True, stream=None, times_path=TIMES, jobs: int = 1):
        self.jobs = max(1, jobs)
        self._lock = threading.Lock()
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.times_path = times_path
        try:
            self.history = json.loads(times_path.read_text())
        except (OSError, ValueError):
            self.history = {}
        self.pending = {}  # key -> shape key, in run order
        for shape_id, dims, counts in shapes:
            sk = _shape_key(shape_id, dims)
            self.pending[f"{sk} warm-up"] = sk
            for tokens, real in (counts if executing else ()):
                self.pending[f"{sk} m{tokens}r{real}"] = sk
        self.total_cases = sum(1 for k in self.pending if not k.endswith(" warm-up"))
        self.cases_done = 0
        self.timed = {}  # key -> seconds this run
        self.start = self.since = time.perf_counter()
        self.text = ""
        if self.tty:  # a terminal: redraw every second, so the clock moves during a long case
            self._ticking = threading.Event()
            threading.Thread(target=self._tick, daemon=True).start()

    def _tick(self) -> None:
        while not self._ticking.wait(1.0):
            with self._lock:
                self.stream.write("\r\x1b[K" + self.line()[:200])
                self.stream.flush()

    # -- what the harness reports ----------------------------------------------------------------------
    def status(self, text: str) -> None:
        """What runs now (the next pending warm-up or case)."""
        self.text = text
        self.since = time.perf_counter()
        self._draw(log=True)

    def warmed(self, shape_id: str, dims_json: str, seconds: float) -> None:
        self._record(f"{_shape_key(shape_id, dims_json)} warm-up", seconds)

    def done(self, shape_id: str, dims_json: str, count: tuple, seconds: float) -> None:
        self.cases_done += 1
        self._record(f"{_shape_key(shape_id, dims_json)} m{count[0]}r{count[1]}", seconds)

    def out(self, text: str = "") -> None:
        """Print a result line on stdout, the bar lifted off the terminal line meanwhile."""
        with self._lock:
            if self.tty:
                self.stream.write("\r\x1b[K")
                self.stream.flush()
            print(text, flush=True)
        self._draw(log=False)

    def finish(self) -> None:
        with self._lock:
            if self.tty:
                self._ticking.set()
                self.stream.write("\r\x1b[K")
            self.stream.write(f"done: {self.cases_done} cases in {clock(time.perf_counter() - self.start)}\n")
            self.stream.flush()

    # -- the estimate ----------------------------------------------------------------------------------
    def seconds_left(self) -> float | None:
        """None until something in the remaining work has a time (history or this run)."""
        total, unknown = 0.0, 0
        for i, (key, sk) in enumerate(self.pending.items()):
            warm = key.endswith(" warm-up")
            guess = self.history.get(key)
            if guess is None:
                guess = self._mean(sk, warm)
            if guess is None:
                unknown += 1
            else:  # the first pending one is running: less what it has run
                guess = max(guess - (time.perf_counter() - self.since), 0.0) if i == 0 else guess
                total += guess if warm else guess / self.jobs  # warm-ups run one at a time
        return None if unknown and not total else total

    def _mean(self, shape_key: str, warm: bool):
        """The mean time of the same shape's cases (or warm-ups), else of all, this run's else the last's."""
        for times in (self.timed, self.history):
            kind = [(k, v) for k, v in times.items() if k.endswith(" warm-up") == warm]
            pool = [v for k, v in kind if k.startswith(shape_key + " ")] or [v for _, v in kind]
            if pool:
                return sum(pool) / len(pool)
        return None

    def _record(self, key: str, seconds: float) -> None:
        self.pending.pop(key, None)
        self.timed[key] = seconds
        self.history[key] = seconds
        try:
            self.times_path.parent.mkdir(parents=True, exist_ok=True)
            self.times_path.write_text(json.dumps(self.history, indent=0, sort_keys=True))
        except OSError:
            pass  # the estimate is a convenience
        self._draw(log=False)

    def line(self) -> str:
        n, done = self.total_cases, self.cases_done
        filled = WIDTH * done // n if n else WIDTH
        left = self.seconds_left()
        eta = "?" if left is None else "~" + clock(left)
        return (f"[{'#' * filled}{'.' * (WIDTH - filled)}] {done}/{n} cases  "
                f"{clock(time.perf_counter() - self.start)} elapsed, {eta} left  {self.text}")

    def _draw(self, log: bool) -> None:
        with self._lock:
            if self.tty:
                self.stream.write("\r\x1b[K" + self.line()[:200])
            elif log:  # a log file: one line per step, not a redraw
                self.stream.write(self.line() + "\n")
            self.stream.flush()
