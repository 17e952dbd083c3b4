"""Which ranks keep their window's raw trace: the suspects and one healthy peer, decided in the job.

A summary can hide what an engineer needs to challenge it when the workload is asymmetric, so the
design keeps a small raw trace of the *suspected* ranks, and of one healthy peer to compare them
with; keeping every rank's would cost gigabytes a window on a large job. Every rank writes its
window's Chrome trace (bounded by `raw_trace_max_bytes`) to a spool, `<out>/<window>/.raw/`, and
offers its busy time per step (the critical path outside communication: a straggler's is the
largest) through the job's store, off the training thread:

- each rank appends `rank:score;` to one key and counts itself in with `add`;
- the rank that counts the world complete reads the scores once and sets the keep list: the ranks
  whose score stands out (robust z >= SUSPECT_Z, or else the busiest one), at most
  `raw_trace_max_ranks - 1`, and the rank nearest the median (the healthy peer);
- every rank waits for the list (at most `wait_seconds`), then moves its spooled trace to
  `<out>/<window>/rank-<r>.trace.json` (where the engine links it from the report) or deletes it.

A rank that never reports (it died, its store is unreachable) leaves the list unset: the others
delete their spool after the wait and say so (a gap in the next window, not a silence). One decision
is in flight at a time; a window that closes while the last one is still undecided keeps no trace.
Without a job store (one process), the rank keeps its own.

The peers the engine compares are the ranks of one phase and role; the election here knows only the
busy times, so on a job of several roles it can keep a rank that is busy by design. The report links
what was kept either way.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from eroica.schema.patterns import Category, PatternsDoc

PREFIX = "eroica/raw/"
SUSPECT_Z = 3.0            # robust z of a rank's busy time per step above the others'
MAD_FLOOR = 1e-4           # seconds: busy times this alike are equal
POLL_SECONDS = 0.2         # how often a rank looks for the keep list
DISK_RESERVE = 256 << 20   # bytes free on the run's disk below which no raw trace is written


def busy_score(doc: PatternsDoc) -> float:
    """The rank's busy time per step: its critical path outside communication."""
    steps = max(len(doc.step_times.during_seconds), 1)
    return sum(f.critical_seconds for f in doc.functions if f.category != Category.communication) / steps


def choose(scores: dict[int, float], max_ranks: int) -> list[int]:
    """The suspects (or else the busiest rank) and the rank nearest the median, at most `max_ranks`."""
    if not scores or max_ranks <= 0:
        return []
    ranks = sorted(scores)
    v = np.array([scores[r] for r in ranks])
    med = float(np.median(v))
    mad = max(float(np.median(np.abs(v - med))) * 1.4826, MAD_FLOOR)
    z = (v - med) / mad
    order = [ranks[i] for i in np.argsort(-z, kind="stable")]
    suspects = [r for r in order if (scores[r] - med) / mad >= SUSPECT_Z][: max(max_ranks - 1, 1)] or order[:1]
    if len(suspects) < max_ranks:
        rest = [r for r in ranks if r not in suspects]
        if rest:
            suspects.append(min(rest, key=lambda r: (abs(scores[r] - med), r)))
    return sorted(suspects[:max_ranks])


def parse_scores(raw: str) -> dict[int, float]:
    out: dict[int, float] = {}
    for part in raw.split(";"):
        rank, _, score = part.partition(":")
        try:
            out[int(rank)] = float(score)
        except ValueError:
            continue
    return out


def trace_target(mode: str, names_kept: bool, can_elect: bool, final: Path, rank: int,
                 problem: Callable[[str], None]) -> tuple[str | None, bool]:
    """Where a window's raw trace goes (the election's spool beside `final`, or `final`), and whether
    it is elected; None when none is kept: `mode` off, names not kept (a trace has raw names), no folder."""
    if mode == "off" or not names_kept:
        return None, False
    elect = mode == "suspects" and can_elect
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(final.parent).free
        if free < DISK_RESERVE:         # the pattern documents come first
            problem(f"raw trace of {final.parent.name} not kept: {free >> 20} MiB free on its disk "
                    f"(kept from {DISK_RESERVE >> 20} MiB)")
            return None, False
        return str(RawTraceKeeper.spool(final.parent.parent, final.parent.name, rank) if elect else final), elect
    except OSError as exc:
        problem(f"no folder for the raw trace of {final.parent.name}: {exc!r}"[:300])
        return None, False


class RawTraceKeeper:
    """One rank's side of the election (see the module's doc); `problem(text)` records a gap."""

    def __init__(self, store: Any, rank: int, world_size: int, max_ranks: int, wait_seconds: float,
                 problem: Callable[[str], None]) -> None:
        self.store, self.rank, self.world, self.max_ranks = store, rank, world_size, max_ranks
        self.wait_seconds, self.problem = wait_seconds, problem
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.decided: dict[str, bool] = {}        # window -> kept (for tests and the overhead bench)
        self.on_kept: Callable[[str, Path], None] | None = None   # (window, trace): e.g. sent to the service

    @staticmethod
    def spool(out_dir: Path, window: str, rank: int) -> Path:
        d = Path(out_dir) / window / ".raw"
        d.mkdir(parents=True, exist_ok=True)
        return d / f"rank-{rank}.trace.json"

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def join(self, timeout: float) -> None:
        """The pending decision gets `timeout`, then stops (its trace dropped and said)."""
        if self._thread is not None:
            self._thread.join(timeout)
            self._stop.set()
            self._thread.join(2 * POLL_SECONDS + 1.0)

    def offer(self, window: str, score: float, spool: Path, final: Path) -> None:
        if not spool.exists():
            return                                   # no trace was written (over its bound, or failed)
        if self.busy:
            spool.unlink(missing_ok=True)
            self.problem(f"raw trace of {window} not kept: the previous window's keep decision is still pending")
            return
        if self.store is None or self.world <= 1 or not hasattr(self.store, "append"):
            os.replace(spool, final)                  # alone: its own trace is the one to keep
            self._kept(window, final)
            return
        self._thread = threading.Thread(target=self._settle, args=(window, score, spool, final),
                                        name="eroica-raw-keep", daemon=True)
        self._thread.start()

    def _kept(self, window: str, final: Path) -> None:
        self.decided[window] = True
        if self.on_kept is not None:
            self.on_kept(window, final)

    def _settle(self, window: str, score: float, spool: Path, final: Path) -> None:
        key = PREFIX + window
        try:
            self.store.append(key + "/scores", f"{self.rank}:{score:.6g};")
            if int(self.store.add(key + "/n", 1)) >= self.world:    # the last to report decides
                raw = self.store.get(key + "/scores")
                keep = choose(parse_scores(raw.decode() if isinstance(raw, bytes) else str(raw)), self.max_ranks)
                self.store.set(key + "/keep", ",".join(map(str, keep)))
            # polled, not a blocking wait: close() stops it at once (a thread blocked in the store
            # when the interpreter exits can abort the process)
            deadline = time.monotonic() + self.wait_seconds
            while not self.store.check([key + "/keep"]):
                if self._stop.wait(POLL_SECONDS) or time.monotonic() > deadline:
                    raise TimeoutError(f"no keep list within {self.wait_seconds:g} s")
            raw = self.store.get(key + "/keep")
            kept = str(self.rank) in (raw.decode() if isinstance(raw, bytes) else str(raw)).split(",")
            if kept:
                os.replace(spool, final)
                self._kept(window, final)
            else:
                spool.unlink(missing_ok=True)
                self.decided[window] = False
        except Exception as exc:  # noqa: BLE001 - never into the job: the trace is dropped and said
            spool.unlink(missing_ok=True)
            self.decided[window] = False
            self.problem(f"raw trace of {window} not kept: no keep decision ({exc!r})"[:300])
        finally:
            try:
                spool.parent.rmdir()                  # the spool folder, once the last rank has left it
            except OSError:
                pass
