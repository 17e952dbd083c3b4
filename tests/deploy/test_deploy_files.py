"""The deployment files a platform team copies (deploy/, docs/deploy.md) are checked by the tools that will
read them: Prometheus' rules by `promtool check rules` and unit-tested by `promtool test rules`, the scrape
config by `promtool check config`, the Alertmanager routing by `amtool check-config`, the Kubernetes manifests
by `kubernetes-validate --strict` (offline, against the API's schemas), the systemd unit by
`systemd-analyze verify`; and the command each one runs is one eroica accepts."""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
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


def serve_args(argv: list[str]) -> argparse.Namespace:
    """What `eroica serve` makes of these arguments (an option it does not have is refused)."""
    from eroica.cli.main import build_parser

    return build_parser(only=argv[0]).parse_args(argv)


def test_the_kubernetes_manifests_validate_strictly_against_the_schemas_offline() -> None:
    files = sorted((DEPLOY / "kubernetes").glob("*.yaml"))
    assert [f.name for f in files] == ["eroica-serve.yaml", "training-job.yaml"]
    validate = Path(sys.executable).parent / "kubernetes-validate"
    out = tool(str(validate), "--strict", *map(str, files), cwd=ROOT)
    docs = [d for f in files for d in yaml.safe_load_all(f.read_text()) if d]
    assert out.count(" passed for resource ") == len(docs) == 9, out
    # what the containers run is what eroica accepts
    by_kind = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    pod = by_kind[("Deployment", "eroica")]["spec"]["template"]["spec"]
    args = serve_args(pod["containers"][0]["args"])
    assert args.read_token and args.hang_alert_on == "suspected" and args.trusted_proxy == ["10.0.0.0/8"]
    assert serve_args(pod["initContainers"][0]["args"]).migrate
    trainer = by_kind[("Job", "llama-ft")]["spec"]["template"]["spec"]["containers"][0]
    run = serve_args(trainer["command"][1:])
    assert run.command[:2] == ["--", "torchrun"] and str(run.out).startswith("/runs/")
    env = {e["name"] for e in trainer["env"]}
    assert {"EROICA_SINK", "EROICA_SINK_TOKEN"} <= env


def test_a_manifest_with_a_misspelled_field_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    good = (DEPLOY / "kubernetes" / "eroica-serve.yaml").read_text()
    bad.write_text(good.replace("readinessProbe:", "readinesProbe:"))
    validate = Path(sys.executable).parent / "kubernetes-validate"
    p = subprocess.run([str(validate), "--strict", str(bad)], capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "readinesProbe" in p.stdout + p.stderr


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze is not installed")
def test_the_systemd_unit_verifies_and_runs_a_command_eroica_accepts(tmp_path: Path) -> None:
    text = (DEPLOY / "systemd" / "eroica.service").read_text()
    eroica = Path(sys.executable).parent / "eroica"
    unit = tmp_path / "eroica.service"
    unit.write_text(text.replace("/opt/eroica/bin/eroica", str(eroica)))
    p = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and str(unit) not in p.stdout + p.stderr, p.stdout + p.stderr   # no warning
    typo = tmp_path / "typo.service"
    typo.write_text(unit.read_text().replace("Restart=on-failure", "Restrat=on-failure"))
    p = subprocess.run(["systemd-analyze", "verify", str(typo)], capture_output=True, text=True, timeout=60)
    assert "Unknown key 'Restrat'" in p.stdout + p.stderr       # the check does read the unit
    start = text.split("ExecStart=", 1)[1].split("\n# ", 1)[0].replace("\\\n", " ").split("\n")[0]
    argv = shlex.split(start.replace("${EROICA_DB}", "postgresql://eroica@db/eroica"))
    args = serve_args(argv[1:])
    assert args.token_file == Path("/etc/eroica/token") and args.trusted_proxy == ["10.0.0.0/24"]
