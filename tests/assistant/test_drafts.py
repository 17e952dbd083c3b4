"""The assistant on the recorded incidents (offline) and against a real OpenAI-compatible HTTP
server on 127.0.0.1 that replays recorded model replies (good, malformed, unsafe, slow, failing)."""

from __future__ import annotations

import difflib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from model_replay import Replay, replay_server

from eroica.assistant.backends import ModelSettings
from eroica.assistant.draft import draft_all
from eroica.assistant.models import ConfigEdit, Proposal
from eroica.cli.main import main
from eroica.engine.evaluate import find_incidents, load_expected
from eroica.engine.pipeline import DiagnoseOptions, diagnose

ROOT = Path(__file__).parents[2]
WORKLOAD = ROOT / "lab" / "workload.py"
OPTS = DiagnoseOptions(in_process=True)
SECTIONS = ("## The diagnosis it rests on", "## Proposed change", "## Risk", "## Validation plan", "## Rollback",
            "## What was sent to a model", "## Approval")


def repo(tmp: Path) -> Path:
    r = tmp / "repo"
    r.mkdir()
    shutil.copy(WORKLOAD, r / "train.py")
    (r / "README.md").write_text("training job\n")
    return r


def software_incidents() -> list[Path]:
    out = []
    for inc in find_incidents(ROOT / "incidents"):
        exp = load_expected(inc / "expected.yaml").expect
        confident = not exp or exp[0].max_confidence is None or exp[0].max_confidence > 0.5   # drafts need one
        if exp and confident and exp[0].root_cause in ("dataloader_stall", "gc_pause", "framework_config", "user_code",
                                                       "cpu_contention", "workload_imbalance", "unknown"):
            out.append(inc)
    return out


@pytest.mark.parametrize("inc", software_incidents(), ids=lambda p: p.name)
def test_offline_drafts_a_valid_change_request_for_each_software_incident(tmp_path: Path, inc: Path) -> None:
    r = repo(tmp_path)
    before = (r / "train.py").read_text()
    diagnosis = diagnose(inc / "patterns", OPTS)
    outcomes = draft_all(diagnosis, tmp_path / "out", r)
    cause = load_expected(inc / "expected.yaml").expect[0].root_cause
    mine = [o for o in outcomes if o.finding.startswith(cause)]
    assert mine, outcomes
    for o in mine:
        d = Path(o.directory)
        text = (d / "change_request.md").read_text()
        assert all(s in text for s in SECTIONS) and "- Approver: (proposed: `" in text and "not applied" in text
        if o.kind == "code":
            res = subprocess.run(["git", "apply", "--check", str(d / "patch.diff")], cwd=r, capture_output=True)
            assert res.returncode == 0, res.stderr
        elif o.kind == "config":
            assert (d / "config_change.yaml").exists()
        else:
            assert o.kind == "human" and o.refusal and "A human must write the fix" in text
    assert (r / "train.py").read_text() == before                   # nothing is ever applied
    anomaly = any("detect_anomaly" in s.key for w in diagnosis.windows for f in w.findings for s in f.settings)
    # anomaly detection is turned off where the code turns it on; another setting is aligned as config
    expected_kind = {"dataloader_stall": "code", "gc_pause": "code",
                     "framework_config": "code" if anomaly else "config"}.get(cause)
    if expected_kind:
        assert mine[0].kind == expected_kind, mine[0]


def test_a_hardware_finding_gets_a_ticket_not_code(tmp_path: Path) -> None:
    outcomes = draft_all(diagnose(ROOT / "incidents" / "INC-0002" / "patterns", OPTS), tmp_path / "out",
                         repo(tmp_path))
    (o,) = [o for o in outcomes if o.finding.startswith("cpu_throttled")]
    assert o.kind == "ticket" and not (Path(o.directory) / "patch.diff").exists()
    ticket = (Path(o.directory) / "ticket.md").read_text()
    assert "For people." in ticket and all(s in ticket for s in ("## Risk", "## Validation plan", "## Rollback"))


def test_the_gate_refuses_a_config_key_the_evidence_does_not_name() -> None:
    from eroica.assistant.gate import Scope, check_config
    scope = Scope(keys=frozenset({"torch.autograd.detect_anomaly"}))
    unknown = Proposal(kind="config", config=[ConfigEdit(key="x", before="1", after="2")])
    assert "evidence does not" in (check_config(unknown, scope).refusal or "")
    known = Proposal(kind="config",
                     config=[ConfigEdit(key="torch.autograd.detect_anomaly", before="True", after="False")])
    assert check_config(known, scope).refusal is None


# ---- a real OpenAI-compatible HTTP server on 127.0.0.1 replaying recorded model replies ----

@pytest.fixture
def server():  # type: ignore[no-untyped-def]
    with replay_server() as url:
        yield url


def test_the_openai_backend_ends_in_a_valid_draft_or_a_recorded_refusal(tmp_path: Path, server: str) -> None:
    r = repo(tmp_path)
    src = (r / "train.py").read_text().replace(
        "    def make_loader(", "    # shards in /home/alice/shards on vm, from 10.1.2.3:8080 (alice@example.com)\n"
        "    def make_loader(", 1)
    (r / "train.py").write_text(src)
    d = diagnose(ROOT / "incidents" / "INC-0001" / "patterns", OPTS)      # dataloader_stall on rank 1
    # a good reply: the model returns the same kind of fix the offline backend drafts
    good = (tmp_path / "offline")
    (o,) = draft_all(d, good, r)
    good_diff = (Path(o.directory) / "patch.diff").read_text()
    text = (r / "train.py").read_text()
    fixed = _applied(r, good_diff)
    good = _edit(text, fixed)
    # the model copies the prompt's numbered lines: the numbers are dropped, the same draft results
    numbered = {**good, "replacement": "\n".join(f"{int(str(good['start_line'])) + i}: {ln}" for i, ln in
                                                 enumerate(str(good["replacement"]).splitlines()))}
    shell = {**good, "replacement": str(good["replacement"]).replace(
        "persistent_workers=True", "persistent_workers=__import__('os').system('id') or True")}
    outside = {"start_line": 1, "end_line": 1, "replacement": "import os"}     # what no server enforced
    Replay.replies = [
        (200, json.dumps({"kind": "edit", "edit": numbered, "rationale": "workers and prefetch"}), 0.0),
        (200, "Sure! Here is a fix: add more workers.", 0.0),                         # not the structured form
        (200, json.dumps({"kind": "edit", "edit": shell}), 0.0),                        # a shell-out
        (200, json.dumps({"kind": "edit", "edit": outside}), 0.0),                      # outside the target
        (200, json.dumps({"kind": "edit", "edit": good}), 3.0),                         # too slow
        (500, "", 0.0),                                                                 # HTTP error
    ]
    settings = ModelSettings(base_url=server, model="replay", api_key="k", timeout_seconds=1.0)
    results = []
    for i in range(6):
        (o,) = draft_all(d, tmp_path / f"llm{i}", r, backend="openai", settings=settings)
        results.append(o)
        req = (Path(o.directory) / "change_request.md").read_text()
        assert all(s in req for s in SECTIONS) and o.sent_to_model
        assert "sent_to_model.txt" in req
    assert results[0].kind == "code" and results[0].refusal is None
    assert _applied(r, (Path(results[0].directory) / "patch.diff").read_text()) == fixed
    assert "structured form" in (results[1].refusal or "")
    assert "eval/exec" in (results[2].refusal or "")
    assert "outside the located target" in (results[3].refusal or "")
    assert "endpoint failed" in (results[4].refusal or "") and "Timeout" in (results[4].refusal or "")
    assert "endpoint failed" in (results[5].refusal or "")
    assert all(o.kind == "human" for o in results[1:])
    assert (r / "train.py").read_text() == text                     # nothing was applied
    # what was sent: redacted, and only the code around the finding, not the whole file
    sent = (Path(results[0].directory) / "sent_to_model.txt").read_text()
    assert sent.strip() == Replay.prompts[0].strip()
    assert "DataLoader(" in sent and len(sent) < len(text) / 2
    for secret, placeholder in (("/home/alice", "<path>"), (" vm,", "<host>"), ("10.1.2.3", "<ip>"),
                                ("alice@example.com", "<email>")):
        assert secret not in sent and placeholder in sent, (secret, placeholder)
    assert "x `<host>`" in (Path(results[0].directory) / "change_request.md").read_text()
    # the reply's schema went with every request, in OpenAI's form: the server holds the model to it, and
    # to the located target's lines
    assert len(Replay.formats) == 6 and all(f["type"] == "json_schema" and f["json_schema"]["strict"]
                                            for f in Replay.formats)
    first = int((results[0].target or "").split(":")[1].split()[0])        # "train.py:41 `...`"
    props = Replay.formats[0]["json_schema"]["schema"]["properties"]
    assert props["edit"]["properties"]["start_line"]["enum"][0] == first, (props, results[0].target)
    assert "config" not in props and props["kind"]["enum"] == ["edit", "none"]      # the finding names no setting


def _applied(r: Path, diff: str) -> str:
    """The repository's train.py with the diff applied (in a copy)."""
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(r, Path(tmp) / "r")
        (Path(tmp) / "p.diff").write_text(diff)
        subprocess.run(["git", "apply", str(Path(tmp) / "p.diff")], cwd=Path(tmp) / "r", check=True)
        return (Path(tmp) / "r" / "train.py").read_text()


def _edit(before: str, after: str) -> dict[str, object]:
    """The one line edit (a model's reply) that turns `before` into `after`: from the first line that
    differs to the last."""
    a, b = before.splitlines(), after.splitlines()
    ops = [op for op in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes() if op[0] != "equal"]
    i1, j1 = ops[0][1], ops[0][3]
    i2, j2 = ops[-1][2], ops[-1][4]
    if i1 == i2:               # a pure insertion: the line before it is replaced by itself and the new ones
        i1, j1 = i1 - 1, j1 - 1
    return {"start_line": i1 + 1, "end_line": i2, "replacement": "\n".join(b[j1:j2])}


def test_llama_cpp_pythons_server_gets_the_schema_in_its_own_form(monkeypatch: pytest.MonkeyPatch) -> None:
    from eroica.assistant.backends import reply_schema, response_format
    from eroica.assistant.errors import BackendConfigError

    monkeypatch.setenv("EROICA_LLM_RESPONSE_FORMAT", "json_object")
    s = ModelSettings.from_env("http://127.0.0.1:1/v1")
    assert response_format(s.response_format) == {"type": "json_object", "schema": reply_schema()}
    monkeypatch.setenv("EROICA_LLM_RESPONSE_FORMAT", "yaml")
    with pytest.raises(BackendConfigError, match="json_object for llama-cpp-python"):
        ModelSettings.from_env("http://127.0.0.1:1/v1")


def test_the_cli_drafts_and_says_nothing_was_applied(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    from eroica.engine.reports import render

    dj = tmp_path / "d.json"
    dj.write_text(render(diagnose(ROOT / "incidents" / "INC-0004" / "patterns", OPTS), "json"))
    assert main(["draft", str(dj), "--repo", str(repo(tmp_path)), "-o", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "code    gc_pause" in out and "nothing was applied" in out
    assert json.loads((tmp_path / "out" / "drafts.json").read_text())[0]["kind"] == "code"
    assert main(["draft", str(tmp_path / "missing.json"), "-o", str(tmp_path / "o2")]) == 2
    assert "no such file" in capsys.readouterr().out
    assert main(["draft", str(dj), "--backend", "openai", "-o", str(tmp_path / "o3")]) == 2


def test_a_loader_that_is_already_parallel_never_gets_more_workers(tmp_path: Path) -> None:
    """More workers only where the workers the rank already runs have no headroom left and are held
    neither by the disk nor by CPUs they wait for; the evidence that decided is in the change request."""
    from eroica.assistant.backends import more_workers
    from eroica.schema.diagnosis import SignalComparison

    diagnosis = diagnose(ROOT / "incidents" / "INC-0047" / "patterns", OPTS)     # a stalled loader worker
    (f,) = [f for w in diagnosis.windows for f in w.findings if f.root_cause == "dataloader_stall"][:1]
    assert more_workers(f)[0] is None                                          # busy 100%, not blocked
    outcomes = draft_all(diagnosis, tmp_path / "out", repo(tmp_path))
    (o,) = [o for o in outcomes if o.finding.startswith("dataloader_stall")][:1]
    assert o.kind == "code" and "its loader workers are busy 100% of their time" in \
        (Path(o.directory) / "change_request.md").read_text()

    def signals(**ratios: float):  # type: ignore[no-untyped-def]
        return f.model_copy(update={"signals": [SignalComparison(signal=f"loader_worker_{k}_ratio", value=v,
                                                                 peer_median=0.0, peer_p10=0.0, peer_p90=0.0)
                                                for k, v in ratios.items()]})

    assert "already parallel" in (more_workers(signals(busy=0.5))[0] or "")
    assert "same device" in (more_workers(signals(busy=1.0, io_wait=0.9))[0] or "")
    assert "crowd the CPUs" in (more_workers(signals(busy=0.9, runqueue_wait=0.4))[0] or "")
    assert more_workers(f.model_copy(update={"signals": []})) == (
        None, "no loader workers were sampled on the rank: it loads its batches in the training process")


def test_the_checkpoint_draft_writes_the_same_file_from_the_background(tmp_path: Path) -> None:
    """The drafted save runs: one save in flight, the bytes torch.save would have written land at the
    same path after the step returns, and torch.load reads them back unchanged."""
    from eroica.assistant import edits
    from eroica.assistant.targets import Candidate

    script = ("import os\nimport sys\n\nimport torch\n\n\n"
              "def save(state, step):\n"
              "    torch.save(state, os.path.join(sys.argv[1], f'step{step % 2}.pt'))\n\n\n"
              "for step in range(4):\n"
              "    save({'w': torch.full((256, 256), float(step)), 'meta': [step, {'lr': 0.1}]}, step)\n"
              "print('steps done', flush=True)\n")
    line = next(i for i, t in enumerate(script.splitlines(), 1) if "torch.save(" in t)
    drafted = edits.async_checkpoint(script, Candidate("train.py", line, line, script.splitlines()[line - 1].strip()))
    assert "    torch.save(state, _eroica_buffer)\n" in drafted and "torch.distributed" not in drafted
    (tmp_path / "train.py").write_text(drafted)
    res = subprocess.run([sys.executable, str(tmp_path / "train.py"), str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "steps done" in res.stdout, res.stderr
    import torch

    for path, step in ((tmp_path / "step0.pt", 2), (tmp_path / "step1.pt", 3)):   # the last save of each path
        state = torch.load(path)
        assert state["meta"] == [step, {"lr": 0.1}] and torch.equal(state["w"], torch.full((256, 256), float(step)))


def _context(incident: str, cause: str, repo: Path, sites: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    """What a backend gets for the incident's first finding of `cause` against `repo` (the finding's
    sites replaced by `sites`, as the collector would record them there)."""
    from eroica.assistant.backends import Context
    from eroica.assistant.models import load_remediations
    from eroica.engine.rules.source import builtin_knowledge_dir

    d = diagnose(ROOT / "incidents" / incident / "patterns", OPTS)
    f = next(f for w in d.windows for f in w.findings if f.root_cause == cause)
    rem = next(x for x in load_remediations(builtin_knowledge_dir() / "remediations").values()
               if cause in x.root_causes)
    return Context(finding=f if sites is None else f.model_copy(update={"sites": sites}), remediation=rem, repo=repo)


def test_a_models_line_edits_become_the_diff_the_gate_judges(tmp_path: Path) -> None:
    """An edit by line numbers, bounded by the schema to the target's lines; a reply that no server held to
    the schema (lines past the file's end, or backwards, or no edit) is refused with the reason."""
    from eroica.assistant.backends import proposal_of, reply_schema
    from eroica.assistant.models import LineEdit, ModelReply

    r = repo(tmp_path)
    ctx = _context("INC-0001", "dataloader_stall", r)
    assert ctx.target is not None and ctx.target.found is not None
    lo, hi = ctx.target.found.line, ctx.target.found.end_line
    props = reply_schema(ctx)["properties"]
    assert props["edit"]["properties"]["end_line"]["enum"] == list(range(lo, hi + 1)) and "config" not in props
    assert reply_schema(ctx)["required"] == list(props)                 # strict schemas require every property

    text = (r / "train.py").read_text().splitlines()
    delete = proposal_of(ModelReply(kind="edit", edit=LineEdit(start_line=lo, end_line=lo, replacement="")), ctx)
    added = [ln for ln in delete.diff.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    assert delete.kind == "diff" and f"-{text[lo - 1]}" in delete.diff and not added
    same = proposal_of(ModelReply(kind="edit", edit=LineEdit(start_line=lo, end_line=lo,
                                                             replacement=f"{lo}: {text[lo - 1]}")), ctx)
    assert same.kind == "diff" and same.diff == ""           # the gate refuses it: "the draft is an empty diff"
    past = proposal_of(ModelReply(kind="edit", edit=LineEdit(start_line=lo, end_line=10_000, replacement="")), ctx)
    assert past.kind == "none" and "not lines of train.py" in past.rationale
    backwards = proposal_of(ModelReply(kind="edit", edit=LineEdit(start_line=hi, end_line=lo - 1, replacement="")),
                            ctx)
    assert backwards.kind == "none" and f"lines {hi}-{lo - 1}" in backwards.rationale
    nothing = proposal_of(ModelReply(kind="edit"), ctx)
    assert nothing.kind == "none" and "no lines" in nothing.rationale
    step = proposal_of(ModelReply(kind="none", rationale="measure the loader's read time on rank 1"), ctx)
    assert step.kind == "none" and step.rationale.startswith("measure")


def test_a_draft_that_deletes_the_work_the_finding_names_is_refused(tmp_path: Path) -> None:
    """What SmolLM2-135M drafted for the blocking metrics call: the call deleted. It compiles and the
    repository's tests pass, but the metrics are gone; calling it every 10th step keeps them."""
    from eroica.assistant.backends import proposal_of
    from eroica.assistant.draft_yield import find_repos
    from eroica.assistant.gate import check
    from eroica.assistant.models import LineEdit, ModelReply

    shutil.copytree(ROOT / "incidents" / "repos" / "plain_loop", tmp_path / "plain_loop")
    (r,) = find_repos(tmp_path)
    ctx = _context("INC-0013", "user_code", r.path, r.sites)
    assert ctx.target is not None and ctx.target.found is not None and ctx.finding.function == "log_metrics"
    lo, hi = ctx.target.found.line, ctx.target.found.end_line
    lines = (r.path / ctx.target.found.file).read_text().splitlines()
    indent = lines[lo - 1][:len(lines[lo - 1]) - len(lines[lo - 1].lstrip())]
    deleted = proposal_of(ModelReply(kind="edit", edit=LineEdit(start_line=lo, end_line=hi, replacement="")), ctx)
    refusal = check(deleted, r.path, ctx.scope(), "true", sandboxed=False).refusal
    assert refusal is not None and "deletes every use of `log_metrics`" in refusal, refusal
    kept = proposal_of(ModelReply(kind="edit", edit=LineEdit(start_line=lo, end_line=hi, replacement="\n".join(
        [f"{indent}if step % 10 == 0:", *("    " + ln for ln in lines[lo - 1:hi])]))), ctx)
    report = check(kept, r.path, ctx.scope(), "true", sandboxed=False)
    assert report.refusal is None and "still uses `log_metrics`" in " ".join(report.checks), report
