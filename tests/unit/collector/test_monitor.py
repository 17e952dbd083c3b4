"""A single-process Monitor with a forced window: real profiler, real sampler, real pattern file."""

import json
import time

import pytest

from eroica.collector import Monitor, TriggerPolicy
from eroica.collector.monitor import JUDGE_EVERY_STEPS
from eroica.schema.patterns import PatternsDoc

torch = pytest.importorskip("torch")


def loop(mon: Monitor, steps: int, sleep_in_loader: float = 0.0) -> None:
    def data():  # type: ignore[no-untyped-def]
        for _ in range(steps):
            if sleep_in_loader:
                time.sleep(sleep_in_loader)
            yield torch.randn(32, 64)

    model = torch.nn.Linear(64, 64)
    for x in mon.wrap_loader(data()):
        with mon.region("forward"):
            y = model(x).sum()
        y.backward()
        mon.step()


def test_forced_window_writes_a_small_valid_pattern_file(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("EROICA_FORCE_WINDOW_AT_STEP", "5")
    mon = Monitor(out_dir=tmp_path, policy=TriggerPolicy(window_steps=4))
    loop(mon, 12, sleep_in_loader=0.02)   # 4 steps of >= 20 ms: several 20 ms samples
    mon.close()
    files = list(tmp_path.glob("w000-s5/rank-0.json"))
    assert len(files) == 1
    doc = PatternsDoc.model_validate(json.loads(files[0].read_text()))
    assert doc.window.trigger == "forced" and doc.window.end_step == 9
    assert len(doc.step_times.during_seconds) == 4
    names = {(f.category.value, f.name) for f in doc.functions}
    assert ("data", "DataLoader.__next__") in names
    load = next(f for f in doc.functions if f.name == "DataLoader.__next__")
    assert load.critical_seconds >= 4 * 0.009       # the sleeps are on the critical path
    assert load.metric_mean is not None and load.metric_mean < 0.5   # sleeping, not computing
    assert 0 < doc.overhead.pattern_bytes < 20_000
    assert doc.hardware.samples_total > 3


def test_monitor_never_raises_when_it_cannot_write(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("EROICA_FORCE_WINDOW_AT_STEP", "2")
    mon = Monitor(out_dir=blocker / "run", policy=TriggerPolicy(window_steps=2))
    loop(mon, 8)                                   # must not raise into the loop
    mon.close()
    assert not mon.disabled                        # a failed write is a gap; the next window tries again
    assert any(g.source == "write" and "Not a directory" in g.reason for g in mon.gaps)


def test_detector_opens_a_window_by_itself(tmp_path) -> None:  # type: ignore[no-untyped-def]
    pol = TriggerPolicy(warmup_steps=2, baseline_steps=8, recent_steps=4, consecutive_breaches=3, lead_steps=4,
                        poll_every_steps=1, window_steps=3)
    mon = Monitor(out_dir=tmp_path, policy=pol)
    model = torch.nn.Linear(16, 16)
    for step in range(36):
        time.sleep(0.03 if step >= 16 else 0.01)
        model(torch.randn(4, 16)).sum().backward()
        mon.step()
    mon.close()
    assert mon.windows_completed, mon.gaps
    wid = mon.windows_completed[0]
    start = int(wid.split("-s")[1])
    # 3 breaches after step 16, each judged at once (no wait for the detector's turn), then the lead
    assert 18 <= start <= 24 + 2


def test_calm_steps_are_judged_in_turns_and_a_step_above_the_threshold_at_once(tmp_path) -> None:  # type: ignore[no-untyped-def]
    pol = TriggerPolicy(warmup_steps=2, baseline_steps=8, recent_steps=4, poll_every_steps=1, threshold_min_ratio=10.0)
    mon = Monitor(out_dir=tmp_path, policy=pol)
    waiting = []
    for _ in range(40):
        time.sleep(0.005)
        mon.step()
        waiting.append(len(mon._unjudged))
    assert mon._detector.threshold_seconds() is not None and not mon.windows_completed
    # calm steps wait for the detector's turn (a rare breach, 10x a calm step, is judged at once: a turn of its own)
    assert max(waiting) == JUDGE_EVERY_STEPS - 1 and waiting.count(0) <= 40 // JUDGE_EVERY_STEPS + 2
    while not mon._unjudged:                        # some calm steps are waiting ...
        time.sleep(0.005)
        mon.step()
    time.sleep(0.2)                                 # ... when a step 40x the calm one ends
    mon.step()
    assert mon._unjudged == []                      # judged at once, with the steps that waited
    mon.close()


def test_raw_trace_escape_hatch_is_bounded(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("EROICA_FORCE_WINDOW_AT_STEP", "2")
    mon = Monitor(out_dir=tmp_path / "kept", policy=TriggerPolicy(window_steps=2, keep_raw_trace=True))
    loop(mon, 6)
    mon.close()
    trace = tmp_path / "kept" / "w000-s2" / "rank-0.trace.json"
    assert trace.exists() and json.loads(trace.read_text())["traceEvents"]
    mon = Monitor(out_dir=tmp_path / "capped",
                  policy=TriggerPolicy(window_steps=2, keep_raw_trace=True, raw_trace_max_bytes=100))
    loop(mon, 6)
    mon.close()
    assert not (tmp_path / "capped" / "w000-s2" / "rank-0.trace.json").exists()
    doc = json.loads((tmp_path / "capped" / "w000-s2" / "rank-0.json").read_text())
    assert any(g["source"] == "raw_trace" and "over cap" in g["reason"] for g in doc["gaps"])


def test_a_job_the_policy_does_not_cover_is_not_watched_but_can_ask_for_a_window(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("EROICA_POLICY_ELIGIBLE_JOBS", "llm-*, moe-*")
    pol = TriggerPolicy.from_env(TriggerPolicy(warmup_steps=2, baseline_steps=8, recent_steps=4, lead_steps=7,
                                               window_steps=3))
    assert pol.eligible_jobs == ("llm-*", "moe-*") and pol.eligible("llm-7b", 8) is None
    assert "matches none" in (pol.eligible("resnet", 8) or "")
    assert "min_world_size" in (pol.model_copy(update={"min_world_size": 16}).eligible("llm-7b", 8) or "")
    mon = Monitor(out_dir=tmp_path, policy=pol, job="resnet-50")
    model = torch.nn.Linear(16, 16)
    for step in range(60):
        time.sleep(0.03 if step >= 16 else 0.01)      # a slowdown the detector would catch
        if step == 40:
            mon.request_window()
        model(torch.randn(4, 16)).sum().backward()
        mon.step()
    mon.close()
    assert any(g.source == "policy" and "resnet-50" in g.reason for g in mon.gaps)
    assert [w.split("-")[0] for w in mon.windows_completed] == ["w000"]      # only the requested one
    doc = PatternsDoc.model_validate_json((tmp_path / mon.windows_completed[0] / "rank-0.json").read_text())
    assert doc.window.trigger == "requested"


def test_a_burst_opens_a_quiet_window_which_is_not_counted_and_backs_the_detector_off(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Real steps (sleeps): a 5-step burst opens a window after which the job is back at speed (quiet):
    it is not counted in the hour's budget of 1, and the same burst again holds too briefly to open
    another; a sustained slowdown later still gets its window (the budget was kept for it)."""
    pol = TriggerPolicy(warmup_steps=2, baseline_steps=8, recent_steps=4, consecutive_breaches=2, lead_steps=4,
                        poll_every_steps=1, window_steps=3, cooldown_steps=2, max_windows_per_hour=1)
    mon = Monitor(out_dir=tmp_path, policy=pol)
    slow = set(range(16, 21)) | set(range(50, 55)) | set(range(80, 120))
    for step in range(120):
        time.sleep(0.03 if step in slow else 0.01)
        mon.step()
    mon.close()
    starts = sorted(int(w.split("-s")[1]) for w in mon.windows_completed)
    assert mon.quiet_windows >= 1 and 16 < starts[0] < 30, (starts, mon.quiet_windows, mon.gaps)
    assert not any(50 <= s < 75 for s in starts), starts     # the second burst opened nothing ...
    assert any(s > 80 for s in starts), starts               # ... the slowdown did, with a budget of 1


def test_each_setting_is_dated_from_the_step_it_took_its_value(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """What the job started with is dated 0; a setting changed later is dated by the next reading
    (every CONFIG_EVERY_STEPS steps, and at a window's opening): never earlier than the change."""
    from eroica.collector.monitor import CONFIG_EVERY_STEPS

    monkeypatch.setenv("EROICA_FORCE_WINDOW_AT_STEP", str(CONFIG_EVERY_STEPS + 10))
    threads = torch.get_num_threads()
    mon = Monitor(out_dir=tmp_path, policy=TriggerPolicy(window_steps=2))
    model = torch.nn.Linear(8, 8)
    try:
        for step in range(CONFIG_EVERY_STEPS + 14):
            if step == 20:
                torch.set_num_threads(max(1, threads - 1) if threads > 1 else 2)
            model(torch.randn(4, 8)).sum().backward()
            mon.step()
    finally:
        torch.set_num_threads(threads)
        mon.close()
    (f,) = tmp_path.glob("w000-s*/rank-0.json")
    since = {c.key: c.since_step for c in PatternsDoc.model_validate_json(f.read_text()).config}
    assert since["torch.version"] == 0 and since["cpu.count"] == 0
    assert since["torch.num_threads"] == CONFIG_EVERY_STEPS     # changed at step 20, read at the next reading
