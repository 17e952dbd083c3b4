"""Zero-code attach: a Monitor in every rank of an unmodified job (`eroica run -- torchrun ...`).

`eroica.collector.boot` calls `on_torch` once torch has loaded in a process. From then on:
- the Monitor is created right after `torch.distributed.init_process_group` returns (whoever calls
  it: the script, torchrun/elastic, Lightning, Accelerate, DeviceMesh), or at the first step if
  the process group came up some other way, and closed before `destroy_process_group` or at exit;
- a step is an optimizer step (torch's global optimizer step post hook): the first optimizer that
  steps is the one counted, so gradient accumulation and several optimizers per iteration give one
  step per iteration, and an AMP step that GradScaler skipped still ends its iteration.
  `EROICA_STEP=dataloader` counts batches of the first DataLoader instead, and
  `EROICA_STEP=module:function` counts returns of a function (for loops without an optimizer);
- every DataLoader iterator's `next()` is timed (the class's method, not the user's objects);
- a Monitor the user creates (the explicit API) wins: the attached one closes and stands down;
- nothing here raises into the user's program: a failure is one line on stderr and the job goes on
  unwatched.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib
import os
import sys
import time
import weakref
from datetime import timedelta
from types import ModuleType
from typing import Any

from eroica.collector import sites
from eroica.collector.boot import tell_user
from eroica.collector.monitor import Monitor
from eroica.schema.patterns import Category

OUT_ENV = "EROICA_OUT"              # the run directory (the same on every rank; `eroica run --out`)
STEP_ENV = "EROICA_STEP"            # optimizer (default), dataloader, or module:function
RUN_KEY = "eroica/attach/run-dir"


class _State:
    def __init__(self) -> None:
        self.monitor: Monitor | None = None
        self.creating = False                  # our own Monitor is being built (not the user's)
        self.explicit = False                  # the user made a Monitor: stand down
        self.dead = False                      # something failed: the job goes on unwatched
        self.mode = os.environ.get(STEP_ENV, "optimizer").strip() or "optimizer"
        self.primary: weakref.ref[Any] | None = None     # the optimizer (or loader dataset) that counts
        self.steps = 0
        self.batches = 0
        self.pending_fn = False                # EROICA_STEP names a function not defined yet


S = _State()


def _fail(where: str, exc: BaseException) -> None:
    if not S.dead:
        tell_user(f"{where} failed ({exc!r}); the job runs unwatched from here")
    S.dead = True
    mon, S.monitor = S.monitor, None
    if mon is not None:
        with contextlib.suppress(Exception):
            mon.close()


def _run_dir(dist: Any) -> str:
    """Every rank's run directory: EROICA_OUT, else one rank 0 names and shares through the store."""
    out = os.environ.get(OUT_ENV)
    if out:
        return out
    store = dist.distributed_c10d._get_default_store()
    if dist.get_rank() == 0:
        name = os.path.join(os.getcwd(), "eroica-runs", time.strftime("run-%Y%m%d-%H%M%S") + f"-{os.getpid()}")
        store.set(RUN_KEY, name)
        return name
    store.wait([RUN_KEY], timedelta(seconds=60))
    return bytes(store.get(RUN_KEY)).decode()


def start() -> None:
    """Create the attached Monitor when the process group is up (idempotent; never raises)."""
    if S.monitor is not None or S.explicit or S.dead:
        return
    try:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return
        S.creating = True
        try:
            # no gather group: building one is a collective, and a rank that failed to attach must
            # not leave the others waiting in it (each rank writes or sends its own document)
            S.monitor = Monitor(out_dir=_run_dir(dist), gather=False)
        finally:
            S.creating = False
        if S.mode not in ("optimizer", "dataloader"):
            S.pending_fn = True
            _wrap_pending()
    except Exception as exc:
        _fail("starting the monitor", exc)


def _wrap_pending() -> None:
    """EROICA_STEP=module:function, once the function exists (a script may define it after init)."""
    try:
        if _wrap_step_function(S.mode):
            S.pending_fn = False
    except Exception as exc:
        _fail(f"{STEP_ENV}={S.mode}", exc)


def stop() -> None:
    mon, S.monitor = S.monitor, None
    if mon is not None:
        try:
            mon.close()
        except Exception as exc:
            tell_user(f"closing the monitor failed ({exc!r})")


def _step() -> None:
    if S.monitor is None:
        start()
    if S.monitor is not None:
        S.monitor.step()


def _explicit(mon: Monitor) -> None:
    """Monitor.created_hook: a Monitor the user made wins over the attached one."""
    if S.creating:
        return
    S.explicit = True
    stop()


# ------------------------------------------------------------------------------ the hooks
def _after_optimizer_step(opt: Any, _args: Any, _kwargs: Any) -> None:
    try:
        if S.mode != "optimizer" or S.dead:
            return
        first = S.primary() if S.primary is not None else None
        if first is None:
            S.primary = weakref.ref(opt)
        elif first is not opt:
            return                                  # another optimizer of the same iteration
        S.steps += 1
        if S.steps == 1 and S.monitor is not None:
            sites.remember_site(S.monitor.config, "step", sites.caller_site(1))
        _step()
    except Exception as exc:
        _fail("the optimizer step hook", exc)


def _patch_scaler(torch: ModuleType) -> None:
    scaler = getattr(getattr(torch, "amp", None), "GradScaler", None)
    if scaler is None or getattr(scaler.step, "_eroica", False):
        return
    orig = scaler.step

    @functools.wraps(orig)
    def step(self: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        before = S.steps
        out = orig(self, optimizer, *args, **kwargs)
        if S.steps == before and S.mode == "optimizer" and not S.dead:   # skipped (inf/nan): still an iteration
            _after_optimizer_step(optimizer, args, kwargs)
        return out

    step._eroica = True  # type: ignore[attr-defined]
    scaler.step = step


def _patch_loader(torch: ModuleType) -> None:
    it_cls = importlib.import_module("torch.utils.data.dataloader")._BaseDataLoaderIter
    if getattr(it_cls.__next__, "_eroica", False):
        return
    orig = it_cls.__next__

    @functools.wraps(orig)
    def __next__(self: Any) -> Any:
        if S.pending_fn:
            _wrap_pending()
        mon = S.monitor
        if S.mode == "dataloader" and not (S.explicit or S.dead):
            _loader_step(self)
            mon = S.monitor
        if mon is None:
            return orig(self)
        t0 = time.monotonic_ns()
        item = orig(self)
        mon._record_safely(t0, Category.data, "DataLoader.__next__")
        if not getattr(self, "_eroica_seen", False):
            _note_loader(mon, self)
        return item

    __next__._eroica = True  # type: ignore[attr-defined]
    it_cls.__next__ = __next__


def _loader_step(it: Any) -> None:
    """EROICA_STEP=dataloader: each batch of the first loader after its first ends a step."""
    try:
        first = S.primary() if S.primary is not None else None
        if first is None:
            S.primary = weakref.ref(it._dataset)
        elif first is not it._dataset:
            return
        S.batches += 1
        if S.batches > 1:
            _step()
    except Exception as exc:
        _fail("the DataLoader step", exc)


def _note_loader(mon: Monitor, it: Any) -> None:
    """The loader's settings, as `wrap_loader` records them (of the loader that counts)."""
    with contextlib.suppress(Exception):
        it._eroica_seen = True
        for key, attr in (("num_workers", "_num_workers"), ("pin_memory", "_pin_memory"),
                          ("prefetch_factor", "_prefetch_factor"), ("persistent_workers", "_persistent_workers")):
            if hasattr(it, attr):
                mon.config[f"dataloader.{key}"] = str(getattr(it, attr))
        sites.remember_site(mon.config, "loader", getattr(it, "_eroica_site", None))
        batch = getattr(getattr(it, "_index_sampler", None), "batch_size", None)
        if batch is not None:
            mon.config["dataloader.batch_size"] = str(batch)


def _wrap_step_function(spec: str) -> bool:
    """EROICA_STEP=module:qualname: every return of that function ends a step. False while the
    module has no such name yet."""
    mod_name, _, qual = spec.partition(":")
    if not mod_name or not qual:
        raise ValueError(f"{STEP_ENV}={spec!r}: use optimizer, dataloader, or module:function")
    owner: Any = sys.modules.get(mod_name) or importlib.import_module(mod_name)
    *path, name = qual.split(".")
    for part in path:
        owner = getattr(owner, part, None)
    fn = getattr(owner, name, None)
    if fn is None:
        return False
    if getattr(fn, "_eroica", False):
        return True

    @functools.wraps(fn)
    def counted(*args: Any, **kwargs: Any) -> Any:
        out = fn(*args, **kwargs)
        try:
            _step()
        except Exception as exc:
            _fail(f"{STEP_ENV} step", exc)
        return out

    counted._eroica = True  # type: ignore[attr-defined]
    setattr(owner, name, counted)
    return True


def _patch_dist(torch: ModuleType) -> None:
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    if c10d is None or not hasattr(c10d, "init_process_group"):
        raise RuntimeError("this torch has no torch.distributed.init_process_group")
    init, destroy = c10d.init_process_group, c10d.destroy_process_group
    if getattr(init, "_eroica", False):
        return

    @functools.wraps(init)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        out = init(*args, **kwargs)
        start()
        return out

    @functools.wraps(destroy)
    def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
        if args or kwargs.get("group") is not None:     # a subgroup: the job goes on
            return destroy(*args, **kwargs)
        stop()
        return destroy(*args, **kwargs)

    init_process_group._eroica = True  # type: ignore[attr-defined]
    for attr, old, new in (("init_process_group", init, init_process_group),
                           ("destroy_process_group", destroy, destroy_process_group)):
        for name, mod in list(sys.modules.items()):     # every module that bound it by name already
            if (name == "torch" or name.startswith("torch.")) and getattr(mod, attr, None) is old:
                setattr(mod, attr, new)


def on_torch(torch: ModuleType) -> None:
    """Patch what the attach needs, once torch has loaded; a failure leaves the job unwatched."""
    try:
        _patch_dist(torch)
        importlib.import_module("torch.optim.optimizer").register_optimizer_step_post_hook(_after_optimizer_step)
        _patch_scaler(torch)
        _patch_loader(torch)
        sites.install_loader_sites()
        Monitor.created_hook = _explicit
        atexit.register(stop)
    except Exception as exc:
        _fail(f"attaching to torch {getattr(torch, '__version__', '?')}", exc)
