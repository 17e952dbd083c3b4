"""Targets come from the evidence and edits keep the code as written: the recorded site picks one
loader among several, a test file is never a target, ambiguity drafts nothing, and the diff only
touches the target's lines (comments, line breaks and quotes survive)."""

from __future__ import annotations

from pathlib import Path

from eroica.assistant import edits, targets
from eroica.assistant.backends import Context, offline
from eroica.assistant.draft_yield import find_repos
from eroica.assistant.models import load_remediations
from eroica.engine.pipeline import DiagnoseOptions, diagnose
from eroica.engine.rules.source import builtin_knowledge_dir

ROOT = Path(__file__).parents[2]
REPOS = ROOT / "incidents" / "repos"


def finding(inc: str, cause: str):  # type: ignore[no-untyped-def]
    d = diagnose(ROOT / "incidents" / inc / "patterns", DiagnoseOptions(in_process=True))
    return next(f for w in d.windows for f in w.findings if f.root_cause == cause)


def rem(rid: str):  # type: ignore[no-untyped-def]
    return load_remediations(builtin_knowledge_dir() / "remediations")[rid]


def test_the_recorded_site_picks_the_training_loader_and_leaves_the_eval_loader_alone() -> None:
    repo = next(r for r in find_repos(REPOS) if r.name == "several_loaders")
    f = finding("INC-0001", "dataloader_stall").model_copy(update={"sites": repo.sites})
    p = offline(Context(finding=f, remediation=rem("dataloader-workers"), repo=repo.path))
    assert p.kind == "diff" and "data.py" in p.diff
    removed = [ln for ln in p.diff.splitlines() if ln.startswith("-") and not ln.startswith("---")]
    assert removed == ["-                       num_workers=1)  # raised from 0 after the last incident"]
    assert "deterministic eval" not in "".join(ln for ln in p.diff.splitlines() if ln[:1] in "+-")


def test_without_a_site_two_candidates_draft_nothing_and_are_named() -> None:
    repo = REPOS / "ambiguous"
    p = offline(Context(finding=finding("INC-0001", "dataloader_stall"), remediation=rem("dataloader-workers"),
                        repo=repo))
    assert p.kind == "none" and "2 candidates" in p.rationale
    assert "scripts/pretrain.py:7" in p.rationale and "scripts/finetune.py:7" in p.rationale


def test_a_test_file_is_never_a_target(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text("from torch.utils.data import DataLoader\nDataLoader([1])\n")
    (tmp_path / "conftest.py").write_text("from torch.utils.data import DataLoader\nDataLoader([1])\n")
    f = finding("INC-0001", "dataloader_stall").model_copy(
        update={"sites": {"loader": f"{tmp_path}/tests/test_x.py:2"}})
    t = targets.loader(tmp_path, f)
    assert t.found is None and not t.candidates


def test_a_multiline_call_keeps_its_comments_and_only_its_lines_change() -> None:
    text = ("loader = DataLoader(\n    data,  # the shards\n    batch_size=8,\n    shuffle=True,  # every epoch\n)\n"
            "other = DataLoader(x, batch_size=2)  # left alone\n")
    c = targets.Candidate("t.py", 1, 5, "loader = DataLoader(")
    new = edits.loader_kwargs(text, c, 4, 4, pin=False)
    assert new.splitlines()[:4] == text.splitlines()[:4]
    assert "    num_workers=4,\n    prefetch_factor=4,\n    persistent_workers=True,\n)\n" in new
    assert new.endswith("other = DataLoader(x, batch_size=2)  # left alone\n")


def test_the_step_recorded_in_a_helper_finds_the_loop_that_calls_it() -> None:
    repo = next(r for r in find_repos(REPOS) if r.name == "anomaly_blocks")
    f = finding("INC-0004", "gc_pause").model_copy(update={"sites": repo.sites})
    t = targets.loop(repo.path, f)
    assert t.found is not None and t.found.file == "train.py" and t.found.text == "for epoch in range(epochs):"


def test_a_site_whose_absolute_path_exists_elsewhere_resolves_inside_the_repository(tmp_path: Path) -> None:
    """The job ran from /work/x/train.py; the draft is made on a copy: the copy's file is the target."""
    original = tmp_path / "job" / "train.py"
    original.parent.mkdir()
    original.write_text("x = 1\n")
    repo = tmp_path / "copy"
    repo.mkdir()
    (repo / "train.py").write_text("x = 1\n")
    assert targets.resolve_site(repo, f"{original}:1 < /nowhere/else.py:3") == [("train.py", 1)]


def test_new_loader_arguments_copy_no_neighbours_comment() -> None:
    from eroica.assistant.edits import loader_kwargs
    from eroica.assistant.targets import Candidate

    text = ("from torch.utils.data import DataLoader\ndef make(ds):\n    return DataLoader(ds,\n"
            "                      batch_size=8,  # small\n                      shuffle=True)  # every epoch\n")
    out = loader_kwargs(text, Candidate("t.py", 3, 5, "return DataLoader("), 4, 4, False)
    assert out.count("# small") == 1 and out.count("# every epoch") == 1, out
    assert "shuffle=True,\n" in out and "persistent_workers=True)  # every epoch" in out, out


def test_the_loader_arguments_go_on_the_loader_not_a_call_inside_it() -> None:
    """`DataLoader(TensorDataset(torch.randn(...)))` starts three calls on one line: the draft once gave
    `torch.randn` the workers (it compiled, and a validation that never built the loader passed it)."""
    from eroica.assistant.edits import loader_kwargs
    from eroica.assistant.targets import Candidate

    text = ("import torch\nfrom torch.utils.data import DataLoader, TensorDataset\ndef make():\n"
            "    return DataLoader(TensorDataset(torch.randn(8, 4)),\n                      batch_size=2)\n")
    out = loader_kwargs(text, Candidate("t.py", 4, 5, "return DataLoader("), 4, 4, False)
    assert "torch.randn(8, 4))," in out and "batch_size=2,\n                      num_workers=4," in out, out
    compile(out, "t.py", "exec")


def test_a_length_imbalance_never_gets_drop_last_and_a_trainer_buckets_by_length() -> None:
    import pytest

    from eroica.assistant.edits import NotDrafted, balanced_sampler
    from eroica.assistant.targets import Candidate

    loader = ("from torch.utils.data import DataLoader\ndef make(d, s):\n"
              "    return DataLoader(d, batch_size=1, sampler=s)\n")
    with pytest.raises(NotDrafted, match="bucket the samples by length"):
        balanced_sampler(loader, Candidate("t.py", 3, 3, "return DataLoader("))
    args = ("from transformers import TrainingArguments\ndef a():\n"
            "    return TrainingArguments(output_dir='o')\n")
    out = balanced_sampler(args, Candidate("t.py", 3, 3, "return TrainingArguments("))
    assert "group_by_length" in out and "drop_last" not in out


def test_an_unshuffled_distributed_sampler_is_shuffled_where_the_loader_takes_it(tmp_path: Path) -> None:
    """A persistent single-rank skew and a loader whose DistributedSampler(shuffle=False) fixes each
    rank's shard by index: the draft shuffles that sampler (found through the loader's `sampler=`), on
    its own line only; a sampler that already shuffles, or a loader sharded some other way, gets none."""
    import difflib
    import shutil

    import pytest

    from eroica.assistant.edits import NotDrafted, balanced_sampler

    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "tests" / "e2e" / "verify_repos" / "interleaved_sources", repo)
    text = (repo / "train.py").read_text()
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines, 1) if "loader = DataLoader(" in line)
    f = finding("INC-0003", "workload_imbalance")
    f = f.model_copy(update={"sites": {"loader": f"/job/train.py:{at} < /job/train.py:70"}})
    t = targets.sampler(repo, f)
    assert t.kind == "sampler" and t.found is not None, t
    assert lines[t.found.line - 1].strip().startswith("sampler = DistributedSampler("), t
    assert f"train.py:{at}" in t.why
    out = balanced_sampler(text, t.found)
    changed = [ln for ln in difflib.unified_diff(text.splitlines(), out.splitlines(), lineterm="", n=0)
               if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]
    new = "+    sampler = DistributedSampler(corpus, num_replicas=world, rank=rank, shuffle=True)"
    assert changed == [f"-{lines[t.found.line - 1]}", new], changed
    # inline in the loader's call
    inline = text.replace("sampler=sampler,", "sampler=DistributedSampler(corpus, shuffle=False),")
    (repo / "train.py").write_text(inline)
    t = targets.sampler(repo, f)
    assert t.kind == "sampler" and t.found is not None and t.found.line == at
    assert "sampler=DistributedSampler(corpus, shuffle=True)," in balanced_sampler(inline, t.found)
    # a sampler passed in from elsewhere, with an eval loader's unshuffled sampler of the same name in
    # another function above: that one is not this loader's, so the loader itself is the target
    passed = text.replace("def main() -> None:", "def evaluation(corpus):\n"
                          "    sampler = DistributedSampler(corpus, shuffle=False)\n"
                          "    return DataLoader(corpus, sampler=sampler)\n\n\n"
                          "def main(sampler=None) -> None:").replace(
        "    sampler = DistributedSampler(corpus, num_replicas=world, rank=rank, shuffle=False)\n", "")
    (repo / "train.py").write_text(passed)
    at_passed = next(i for i, line in enumerate(passed.splitlines(), 1) if "loader = DataLoader(" in line)
    t = targets.sampler(repo, f.model_copy(update={"sites": {"loader": f"/job/train.py:{at_passed}"}}))
    assert t.kind == "loader" and t.found is not None and t.found.line == at_passed, t
    # already shuffled: nothing to draft; a loader without a DistributedSampler: the loader, no draft
    shuffled = text.replace(", shuffle=False)", ")")
    (repo / "train.py").write_text(shuffled)
    t = targets.sampler(repo, f)
    with pytest.raises(NotDrafted, match="already shuffles"):
        balanced_sampler(shuffled, t.found)  # type: ignore[arg-type]
    plain = text.replace("sampler=sampler,", "shuffle=False,")
    (repo / "train.py").write_text(plain)
    t = targets.sampler(repo, f)
    assert t.kind == "loader" and t.found is not None and t.found.line == at
    with pytest.raises(NotDrafted, match="bucket the samples by length"):
        balanced_sampler(plain, t.found)


def test_a_cause_no_template_fixes_sends_the_model_the_loop_and_the_recorded_stack() -> None:
    """unknown (time no recorded function held) and transient_stall have no template: the model gets
    the code the evidence points at (the training loop here) and each recorded stack's frames in the
    repository with their source lines (frames elsewhere, a path with a token in it, are not sent), and
    is told to propose a change there or one concrete next step."""
    from eroica.assistant.backends import prompt
    from eroica.assistant.redact import Redactor

    repo = next(r for r in find_repos(REPOS) if r.name == "plain_loop")
    secret = "hf_abcdefghijklmnopqrstu123456"
    for inc, cause in (("INC-0036", "unknown"), ("INC-0032", "transient_stall")):
        f = finding(inc, cause).model_copy(update={"sites": {**repo.sites, "step": f"/srv/{secret}/x.py:3 < "
                                                                                  + repo.sites["step"]}})
        ctx = Context(finding=f, remediation=None, repo=repo.path)
        assert ctx.target is not None and ctx.target.found is not None, ctx.target
        assert ctx.target.kind == "loop" and ctx.target.found.text.startswith("for _ in range(epochs)")
        assert ctx.scope().lines == {"train.py": [(ctx.target.found.line, ctx.target.found.end_line)]}
        sent = prompt(ctx, Redactor.for_site(hostnames=[]))
        step_line = next(i for i, ln in enumerate((repo.path / "train.py").read_text().splitlines(), 1)
                         if "mon.step()" in ln)
        assert "Recorded call stack at `step` (innermost first):" in sent, sent
        assert f"- train.py:{step_line}: mon.step()" in sent and secret not in sent and "/srv/" not in sent
        assert "No template fixes this cause" in sent and "for _ in range(epochs)" in sent
        assert offline(ctx).kind == "none"                  # offline: a person's judgement, as before
