"""The real Prometheus and Alertmanager (Debian's `prometheus` and `prometheus-alertmanager`, installed by
.ci/run), each started by the test that needs it on 127.0.0.1 with its own config and storage in the test's
temp dir, stopped by its pid; and reads of their own HTTP APIs."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from service_support import free_port, stop

ROOT = Path(__file__).parents[1]
ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
AMTOOL = shutil.which("amtool")
WHY = "Debian's prometheus and prometheus-alertmanager are not installed (.ci/run installs them)"
needs_prometheus = pytest.mark.skipif(not (PROMETHEUS and PROMTOOL), reason=WHY)
needs_alertmanager = pytest.mark.skipif(not (ALERTMANAGER and AMTOOL), reason=WHY)


def _wait(url: str, proc: subprocess.Popen[bytes], log: Path, what: str, seconds: float = 30) -> None:
    deadline = time.time() + seconds
    while True:
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                raise AssertionError(f"{what} did not start:\n{log.read_text()[-3000:]}") from None
            time.sleep(0.2)


@contextlib.contextmanager
def _process(cmd: list[str], log: Path, ready: str, what: str) -> Iterator[None]:
    out = log.open("w")
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait(ready, proc, log, what)
        yield
    finally:
        stop(proc)
        out.close()


def quick_alertmanager_config(path: Path = ROOT / "deploy" / "alertmanager" / "alertmanager.yml") -> dict[str, Any]:
    """The shipped routing with waits of a second and receivers that send nowhere (the routing, grouping,
    inhibition and deduplication are Alertmanager's own, as shipped)."""
    cfg = yaml.safe_load(path.read_text())

    def quick(route: dict[str, Any]) -> None:
        for k in ("group_wait", "group_interval"):
            if k in route:
                route[k] = "1s"
        for r in route.get("routes", []):
            quick(r)

    quick(cfg["route"])
    cfg["route"].update(group_wait="1s", group_interval="1s")
    cfg["receivers"] = [{"name": r["name"]} for r in cfg["receivers"]]
    return cfg


@contextlib.contextmanager
def alertmanager(tmp: Path, config: dict[str, Any] | None = None) -> Iterator[str]:
    """A real Alertmanager on 127.0.0.1 (no cluster port), its URL."""
    d = tmp / "alertmanager"
    d.mkdir(parents=True, exist_ok=True)
    (d / "alertmanager.yml").write_text(yaml.safe_dump(config or quick_alertmanager_config()))
    check = subprocess.run([str(AMTOOL), "check-config", str(d / "alertmanager.yml")], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with _process([str(ALERTMANAGER), f"--config.file={d / 'alertmanager.yml'}", f"--storage.path={d / 'data'}",
                   f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=", "--log.level=warn"],
                  d / "log", url + "/-/ready", "Alertmanager"):
        yield url


def active_alerts(am: str, **labels: str) -> list[dict[str, Any]]:
    """Alertmanager's own list of the alerts it holds firing (a resolved alert is not in it)."""
    got = json.loads(urllib.request.urlopen(am + "/api/v2/alerts", timeout=5).read())
    return [a for a in got if all(a["labels"].get(k) == v for k, v in labels.items())]


def alert_groups(am: str) -> list[dict[str, Any]]:
    return list(json.loads(urllib.request.urlopen(am + "/api/v2/alerts/groups", timeout=5).read()))


@contextlib.contextmanager
def prometheus(tmp: Path, targets: list[str], am: str | None, every: str = "1s",
               rules: Path = ROOT / "deploy" / "prometheus" / "eroica-rules.yml") -> Iterator[str]:
    """A real Prometheus scraping `targets` (host:port) as job "eroica" every `every`, evaluating the shipped
    rules at that interval (their groups' own intervals shortened to it), alerting to `am`; its URL."""
    d = tmp / "prometheus"
    d.mkdir(parents=True, exist_ok=True)
    groups = yaml.safe_load(rules.read_text())
    for g in groups["groups"]:
        g.pop("interval", None)
    (d / "rules.yml").write_text(yaml.safe_dump(groups))
    cfg: dict[str, Any] = {
        "global": {"scrape_interval": every, "evaluation_interval": every},
        "rule_files": [str(d / "rules.yml")],
        "scrape_configs": [{"job_name": "eroica", "static_configs": [{"targets": targets}]}]}
    if am:
        cfg["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [am.removeprefix("http://")]}]}]}
    (d / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    check = subprocess.run([str(PROMTOOL), "check", "config", str(d / "prometheus.yml")], capture_output=True,
                           text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with _process([str(PROMETHEUS), f"--config.file={d / 'prometheus.yml'}", f"--storage.tsdb.path={d / 'data'}",
                   f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"], d / "log", url + "/-/ready",
                  "Prometheus"):
        yield url


def query(prom: str, expr: str) -> list[dict[str, Any]]:
    """An instant query through Prometheus' HTTP API: its result vector."""
    got = json.loads(urllib.request.urlopen(f"{prom}/api/v1/query?{urllib.parse.urlencode({'query': expr})}",
                                            timeout=5).read())
    assert got["status"] == "success", got
    return list(got["data"]["result"])


def targets(prom: str) -> list[dict[str, Any]]:
    return list(json.loads(urllib.request.urlopen(prom + "/api/v1/targets", timeout=5).read())["data"]
                ["activeTargets"])


def prom_alerts(prom: str) -> list[dict[str, Any]]:
    return list(json.loads(urllib.request.urlopen(prom + "/api/v1/alerts", timeout=5).read())["data"]["alerts"])
