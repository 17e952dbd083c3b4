"""The stack sampler names the user function that spends time no recorded function holds: a real
thread, really sampled (no fake clock), blocking in a function of this file."""

from __future__ import annotations

import json
import os
import sysconfig
import threading
import time
from pathlib import Path

from eroica.collector.critical import Execution, attribute
from eroica.collector.stack_sampler import StackSampler, is_user_file
from eroica.schema.patterns import Category


def report_metrics(done: threading.Event) -> None:
    time.sleep(0.25)                          # a blocking call: C code, no Python frame of its own
    json.dumps(list(range(10)))               # the standard library: still this function's time
    done.set()


def train(started: threading.Event, done: threading.Event) -> None:
    started.wait(5)
    report_metrics(done)


def test_library_and_eroica_files_are_not_user_code() -> None:
    assert not is_user_file(json.__file__)
    assert not is_user_file(os.path.join(sysconfig.get_paths()["purelib"], "torch", "nn", "modules", "module.py"))
    assert not is_user_file(threading.__file__) and not is_user_file("<frozen importlib._bootstrap>")
    import eroica.collector.window as w
    assert not is_user_file(w.__file__)
    assert is_user_file(__file__)


def test_a_blocking_user_function_is_named_with_its_call_site() -> None:
    started, done = threading.Event(), threading.Event()
    t = threading.Thread(target=train, args=(started, done))
    t.start()
    s = StackSampler(0.004)
    assert s.start(t.ident) is None
    t0 = time.monotonic_ns()
    started.set()
    assert done.wait(5)
    t.join(5)
    t1 = time.monotonic_ns()
    ex, sites, gap = s.stop(t0, t1)
    assert gap is None
    mine = [e for e in ex if e.name == "report_metrics"]
    assert mine and all(e.category == Category.python for e in ex)
    held = sum(e.end_ns - e.start_ns for e in mine) / 1e9
    assert 0.2 <= held <= 0.3, held
    # the site: inside the function, then the line that called it (the statement a draft moves)
    inner, caller = sites["function.report_metrics"].split(" < ")[:2]
    lines = Path(__file__).read_text().splitlines()
    assert inner.startswith(os.path.abspath(__file__) + ":")
    assert "time.sleep(0.25)" in lines[int(inner.rsplit(":", 1)[1]) - 1]
    assert "report_metrics(done)" in lines[int(caller.rsplit(":", 1)[1]) - 1]


def test_sampled_time_holds_only_what_no_recorded_function_holds() -> None:
    s = StackSampler(0.004)
    sampled = s._executions(0, 0)                        # nothing sampled: nothing claimed
    assert sampled == []
    recorded = [Execution(0, 60_000_000, Category.compute, "aten::addmm")]
    blocking = [Execution(20_000_000, 100_000_000, Category.python, "report_metrics")]
    seg = attribute(recorded + blocking, 0, 120_000_000)
    held = {seg.names[k][1]: 0 for k in seg.key}
    for a, b, k in zip(seg.start_ns, seg.end_ns, seg.key):
        held[seg.names[k][1]] += int(b - a)
    assert held == {"aten::addmm": 60_000_000, "report_metrics": 40_000_000, "untracked": 20_000_000}


def test_a_thread_that_ends_stops_the_sampling_without_error() -> None:
    t = threading.Thread(target=time.sleep, args=(0.02,))
    t.start()
    s = StackSampler(0.002)
    assert s.start(t.ident) is None
    t.join()
    time.sleep(0.02)
    ex, _sites, gap = s.stop(0, time.monotonic_ns())
    assert gap is None and all(e.name != "report_metrics" for e in ex)


def test_time_inside_a_frameworks_python_is_not_the_calling_user_functions(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A pipeline schedule or a module's hooks run in the framework's Python, called from the user's
    loop: that time stays untracked, not named after the loop's function (which holds every call)."""
    import importlib.util

    from eroica.collector import stack_sampler as ss

    lib = tmp_path / "site" / "fwlib"
    lib.mkdir(parents=True)
    (lib / "schedule.py").write_text("import time\n\ndef step(done):\n    time.sleep(0.25)\n    done.set()\n")
    spec = importlib.util.spec_from_file_location("fwlib_schedule", lib / "schedule.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(ss, "_LIBRARY", (str(tmp_path / "site") + os.sep, *ss._LIBRARY))   # installed, as torch is
    monkeypatch.setattr(ss, "FRAMEWORKS", (os.sep + "fwlib" + os.sep,))
    assert ss._kind(str(lib / "schedule.py")) == "framework" and ss._kind(json.__file__) == "other"
    assert ss._kind(__file__) == "user"
    import eroica.collector.monitor as monitor
    assert ss._kind(monitor.__file__) == "framework"      # eroica's own time (mon.step) is not the loop's

    def training_loop(done: threading.Event) -> None:
        mod.step(done)                                   # the framework's step, called from the user's loop

    done = threading.Event()
    t = threading.Thread(target=training_loop, args=(done,))
    s = StackSampler(0.004)
    t0 = time.monotonic_ns()
    t.start()
    assert s.start(t.ident) is None
    assert done.wait(5)
    t.join(5)
    ex, sites, _gap = s.stop(t0, time.monotonic_ns())
    assert not [e for e in ex if e.name == "training_loop"] and "function.training_loop" not in sites



def save_checkpoint(path: Path, state: dict[str, object], saves: int) -> None:
    import torch

    for _ in range(saves):
        torch.save(state, path)              # torch's blocking I/O: this function waits in it


def test_a_torch_save_is_the_calling_functions_time_not_the_frameworks(tmp_path: Path) -> None:
    """torch.save and torch.load are blocking calls the user's function waits in (a checkpoint to a slow
    volume is the user's save_checkpoint), unlike a framework's own Python work."""
    import torch

    from eroica.collector import stack_sampler as ss

    assert ss._kind(torch.serialization.__file__) == "other"
    assert ss._kind(torch.nn.modules.module.__file__) == "framework"
    state: dict[str, object] = {f"w{i}": torch.randn(256, 256) for i in range(32)}
    t = threading.Thread(target=save_checkpoint, args=(tmp_path / "c.pt", state, 40))
    s = StackSampler(0.004)
    t0 = time.monotonic_ns()
    t.start()
    assert s.start(t.ident) is None
    t.join(60)
    t1 = time.monotonic_ns()
    ex, sites, _gap = s.stop(t0, t1)
    named = sum(e.end_ns - e.start_ns for e in ex if e.name == "save_checkpoint")
    assert named > 0.5 * (t1 - t0) and "function.save_checkpoint" in sites, (named / (t1 - t0), ex[:5])
