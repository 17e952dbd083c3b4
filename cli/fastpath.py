"""The speed tricks of the batch commands (`eroica diagnose`, `eroica ingest`), in one place.

A small diagnosis takes about as long as starting Python, so three things are done on purpose:
- cyclic garbage collection is held off while the command imports its modules (it rescanned the same
  import-time objects again and again), then
  the imported objects are frozen out of every later collection and collection resumes
  (`resume_collection`);
- while forked ingestion workers summarize traces, the parent does the imports and compiles the
  report template the diagnosis will need (`warm_engine`), instead of after them;
- the process ends with `os._exit` once its output is flushed (`finish`): tearing down numpy's,
  pydantic's and the rule engine's modules is a visible share of a small run. Only commands that
  start no thread and leave no file to clean up after they return are in FAST_EXIT.
Their effect is measured by `bench/traces.py` (eroica diagnose against HTA's trace load). The service's
long-running processes have their own (eroica.engine.heap)."""

from __future__ import annotations

import gc
import os
import sys

#: batch commands whose process may end as soon as their output is flushed
FAST_EXIT = frozenset({"diagnose", "ingest"})


def begin(command: str | None) -> bool:
    """Before the command's imports: hold cyclic collection off for a batch command; True for one."""
    batch = command in FAST_EXIT
    if batch:
        gc.disable()
    return batch


def resume_collection() -> None:
    """The command has imported what it needs: those modules live as long as the process, so their
    objects are frozen out of every later collection, and collection resumes for the work itself. A
    no-op where collection is already on."""
    if not gc.isenabled():
        gc.freeze()
        gc.enable()


def warm_engine(report_format: str) -> None:
    """Import what diagnosing and rendering will need (while ingestion workers run)."""
    import numpy.ma  # noqa: F401          # np.median's first call imports it

    from eroica.engine import diagnose, template

    assert diagnose is not None        # the pipeline's modules, imported now

    if report_format != "json":
        template(report_format)


def finish(rc: int, batch: bool) -> None:
    """End the process with `rc`: a batch command's at once, its output flushed."""
    resume_collection()
    if batch:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    sys.exit(rc)
