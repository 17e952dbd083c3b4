"""The deployment files a platform team copies (deploy/, docs/deploy.md) are checked by the tools that will
read them: Prometheus' rules by `promtool check rules` and unit-tested by `promtool test rules`, the scrape
config by `promtool check config`, the Alertmanager routing by `amtool check-config`."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from monitoring_support import AMTOOL, PROMTOOL, needs_alertmanager, needs_prometheus

ROOT = Path(__file__).parents[2]
DEPLOY = ROOT / "deploy"


def tool(*cmd: str, cwd: Path = DEPLOY) -> str:
    p = subprocess.run(list(cmd), capture_output=True, text=True, cwd=cwd, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout + p.stderr


@needs_prometheus
def test_the_prometheus_rules_check_and_pass_their_unit_tests() -> None:
    out = tool(str(PROMTOOL), "check", "rules", "prometheus/eroica-rules.yml")
    assert "SUCCESS: 16 rules found" in out, out
    assert "SUCCESS" in tool(str(PROMTOOL), "test", "rules", "eroica-rules.test.yml", cwd=DEPLOY / "prometheus")


@needs_prometheus
def test_a_rule_unit_test_that_expects_the_wrong_thing_fails(tmp_path: Path) -> None:
    """The unit tests can fail: a wrong expectation is reported by promtool, not passed."""
    shutil.copy(DEPLOY / "prometheus" / "eroica-rules.yml", tmp_path)
    text = (DEPLOY / "prometheus" / "eroica-rules.test.yml").read_text()
    (tmp_path / "t.yml").write_text(text.replace("severity: critical, job: train-7", "severity: warning, job: train-7"))
    p = subprocess.run([str(PROMTOOL), "test", "rules", "t.yml"], capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode != 0 and "EroicaJobHung" in p.stdout + p.stderr


@needs_prometheus
def test_the_scrape_config_checks() -> None:
    assert "is valid prometheus config file syntax" in tool(str(PROMTOOL), "check", "config",
                                                             "prometheus/prometheus.yml")


@needs_alertmanager
def test_the_alertmanager_routing_checks() -> None:
    out = tool(str(AMTOOL), "check-config", "alertmanager/alertmanager.yml")
    assert "SUCCESS" in out and "1 inhibit rules" in out and "3 receivers" in out, out
