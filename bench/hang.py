"""How soon a hung job is named, at the default policy: for each hang kind, a real 4-rank gloo job
(eroica.lab) hangs at step 30 and posts to a live `eroica serve`; the benchmark asks
`eroica diagnose RUN --format json` (the CLI, as an on-call would) and the service's
`GET /v1/jobs/<id>/hang` every POLL seconds, and prints, for each, the seconds from the stall (the
ranks' last step, from their own snapshots) to the first stored verdict that names the right kind
and rank as suspected, and as confirmed. Then the healthy pauses of tests/e2e/test_hang_pauses_e2e.py
at that file's scaled policy: how many were suspected, resolved, confirmed, and how many issues (and
so alerts) the service opened.

    .venv/bin/python bench/hang.py [--kinds hang_loader,hang_lock,hang_kill,hang_nic] [--no-confirm]
                                   [--healthy-only]

With confirmation (the default), each kind runs until the policy's 300 s confirmation: about 6
minutes a kind. Root is needed for hang_nic (network namespaces); its ranks, each in a namespace of
its own, do not reach the service on this machine's loopback, so it is measured through
`eroica diagnose` only (tests/e2e/test_multihost_e2e.py measures a host cut off through the service)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "e2e")]
EXPECT = {"hang_loader": ("hang_dataloader", [1]), "hang_lock": ("hang_user_code", [1]),
          "hang_kill": ("rank_died", [1]), "hang_nic": ("hang_link", [1]), "hang_gil": ("hang_user_code", [1])}
POLL = 1.0
SETTLE = 15.0


def _get(url: str) -> dict[str, Any] | None:
    try:
        return json.loads(urllib.request.urlopen(url, timeout=5).read())  # type: ignore[no-any-return]
    except OSError:
        return None


def _cli(run: Path) -> dict[str, Any] | None:
    eroica = Path(sys.executable).parent / "eroica"
    out = subprocess.run([str(eroica), "diagnose", str(run), "--format", "json"], capture_output=True, text=True)
    try:
        return json.loads(out.stdout).get("hang")  # type: ignore[no-any-return]
    except ValueError:
        return None


def _stall_start(run: Path) -> float | None:
    starts = []
    for f in run.glob("hang-s*/rank-*.hang.json"):
        try:
            s = json.loads(f.read_text())
            starts.append(s["wall_time"] - s["stalled_seconds"])
        except (OSError, ValueError, KeyError):
            continue
    return min(starts) if starts else None


def one(kind: str, tmp: Path, url: str, confirm: bool) -> dict[str, Any]:
    from eroica.lab.launch import launch

    cause, ranks = EXPECT[kind]
    seconds = 360 if confirm else 75
    run = tmp / kind
    env = {"EROICA_SINK": url, "EROICA_SINK_TOKEN": "bench-token", "EROICA_JOB_NAME": f"bench-{kind}"}
    job = threading.Thread(target=launch, args=(run,), kwargs=dict(
        fault=kind, fault_rank=1, fault_step=30, steps=100_000, env=env, timeout_seconds=seconds, progress=False,
        stop_on_failure=False, extra_args=["--stop-after-windows", "99"], netns=kind == "hang_nic"))
    job.start()
    seen: dict[str, float] = {}
    deadline, ended = time.time() + seconds, None
    # after the job ends (a killed rank's peers fail and exit within seconds), the service is given
    # SETTLE more seconds for the snapshots it already has
    while time.time() < deadline and len(seen) < 4 and (ended is None or time.time() < ended + SETTLE):
        if ended is None and not job.is_alive():
            ended = time.time()
        t0 = time.time()
        verdicts = {"diagnose": _cli(run) if run.exists() else None}
        jobs = _get(f"{url}/v1/jobs") or []
        jid = next((j["id"] for j in jobs if j.get("name") == f"bench-{kind}"), None)
        verdicts["serve"] = _get(f"{url}/v1/jobs/{jid}/hang") if jid else None
        now = time.time()
        for path, h in verdicts.items():
            if h and (h["root_cause"], h["ranks"]) == (cause, ranks) and h["confidence"] >= 0.5:
                seen.setdefault(f"{path} {h['state']}", now)
                if h["state"] == "confirmed":
                    seen.setdefault(f"{path} suspected", now)      # confirmed at once (a failed collective)
        if not confirm and {"diagnose suspected", "serve suspected"} <= seen.keys():
            break
        time.sleep(max(0.0, POLL - (now - t0)))
    job.join()
    start = _stall_start(run)
    return {k: round(v - start, 1) for k, v in seen.items()} if start else {"error": "no snapshot"}


def healthy(tmp: Path, url: str) -> dict[str, Any]:
    from test_hang_pauses_e2e import CASES, SCALED

    from eroica.lab.launch import launch

    out: dict[str, Any] = {}
    for name, args in CASES.items():
        run = tmp / f"healthy-{len(out)}"
        env = {**SCALED, "EROICA_SINK": url, "EROICA_SINK_TOKEN": "bench-token", "EROICA_JOB_NAME": f"ok-{len(out)}"}
        launch(run, steps=62, timeout_seconds=150, progress=False, env=env, extra_args=["--stop-after-windows", "99",
                                                                                          *args])
        states = [json.loads(f.read_text())["state"] for f in run.glob("hang-s*/rank-*.hang.json")]
        out[name] = {"pauses suspected": len(list(run.glob("hang-s*"))),
                     "snapshots resolved": states.count("resolved"), "confirmed": states.count("confirmed")}
    time.sleep(5)                                  # the service's last verdicts
    out["issues opened by the service for these jobs"] = len(
        [i for i in _get(f"{url}/v1/issues") or [] if str(i.get("job_id", "")).startswith("ok-")])
    verdicts = [(_get(f"{url}/v1/jobs/{j['id']}/hang") or {}) for j in _get(f"{url}/v1/jobs") or []
                if str(j["id"]).startswith("ok-")]
    out["the service's verdicts"] = sorted(f"{v.get('state')} {v.get('root_cause')} {v.get('confidence')}"
                                           for v in verdicts if v)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kinds", default="hang_loader,hang_lock,hang_kill,hang_nic")
    p.add_argument("--no-confirm", action="store_true", help="stop each kind at its suspicion (about 1 minute)")
    p.add_argument("--healthy-only", action="store_true")
    args = p.parse_args()
    from service_support import free_port

    tmp = Path(tempfile.mkdtemp(prefix="eroica-bench-hang-"))
    (tmp / "token").write_text("bench-token")
    port = free_port()
    eroica = Path(sys.executable).parent / "eroica"
    log = (tmp / "serve.log").open("w")
    serve = subprocess.Popen([str(eroica), "serve", "--data", str(tmp / "data"), "--port", str(port), "--token-file",
                              str(tmp / "token")], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        while _get(f"{url}/healthz") is None:
            time.sleep(0.2)
        if not args.healthy_only:
            print("| kind | diagnose: suspected | diagnose: confirmed | serve: suspected | serve: confirmed |")
            print("|---|---|---|---|---|")
            for kind in args.kinds.split(","):
                r = one(kind, tmp, url, not args.no_confirm)
                cells = [f"{r[k]:.1f} s" if k in r else "-" for k in ("diagnose suspected", "diagnose confirmed",
                                                                        "serve suspected", "serve confirmed")]
                print(f"| {kind} | " + " | ".join(cells) + " |", flush=True)
        print(json.dumps(healthy(tmp, url), indent=1))
    finally:
        serve.terminate()
        serve.wait(20)
        log.close()
        print(f"(runs under {tmp})")


if __name__ == "__main__":
    main()
