"""Redaction measured on corpora: every one of the secret forms in `secret_corpus.yaml` (the forms the
project's issue found going through, the detect-secrets project's own plugin test cases and gitleaks'
rules as facts, each kind in code, shell, YAML, URLs, config and logs) is gone from what would be sent
(recall 100%), and on the draft corpus's code (the training repositories `eroica eval --drafts` drafts
against, and examples/), which holds no secret, no line gets a secret's placeholder and few lines are
redacted at all (those that are name a path or a URL, which redaction hides by design)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from eroica.assistant.redact import Redactor

ROOT = Path(__file__).parents[2]
CORPUS = yaml.safe_load((Path(__file__).parent / "secret_corpus.yaml").read_text())
CONTEXTS = {"code", "shell", "yaml", "url", "log", "config"}
SECRET_MARKS = ("<secret>", "<token>")


def test_the_corpus_is_what_it_says() -> None:
    assert len(CORPUS) >= 150
    assert {e["context"] for e in CORPUS} == CONTEXTS
    assert all(set(e) == {"kind", "context", "source", "text", "secrets"} and e["secrets"] for e in CORPUS)
    assert all(s in e["text"] for e in CORPUS for s in e["secrets"])
    assert len({e["text"] for e in CORPUS}) == len(CORPUS)
    sources = {e["source"].split(" tests/")[0].split(" config")[0] for e in CORPUS}
    assert {"eroica, forms that once went through", "detect-secrets"} <= sources, sources
    # every form the issue named is in it
    issue = " ".join(e["text"] for e in CORPUS if e["source"] == "eroica, forms that once went through")
    for form in ('os.environ["AWS_SECRET_ACCESS_KEY"]', "setdefault(", "Bearer ", "machine ",
                 "export aws_secret_access_key=", "--password", "mysql", "BEGIN PGP PRIVATE KEY BLOCK", "tcp://",
                 "databricks://", "%eth0", "?token="):
        assert form in issue, form


@pytest.mark.parametrize("entry", CORPUS, ids=[f"{i:03d}-{e['context']}-{e['kind']}" for i, e in enumerate(CORPUS)])
def test_no_secret_of_the_corpus_survives(entry: dict[str, object]) -> None:
    out = Redactor()(str(entry["text"]))
    left = [s for s in entry["secrets"] if s in out]   # type: ignore[attr-defined]
    assert not left, (entry["source"], out)


def test_the_draft_corpus_code_is_barely_touched(capsys: pytest.CaptureFixture[str]) -> None:
    files = sorted((ROOT / "incidents" / "repos").rglob("*.py")) + sorted((ROOT / "examples").rglob("*.py"))
    total, redacted, secret_marked = 0, [], []
    for f in files:
        src = f.read_text().splitlines()
        out = Redactor()("\n".join(src)).splitlines()
        assert len(out) == len(src), f
        for a, b in zip(src, out):
            if not a.strip():
                continue
            total += 1
            if a != b:
                redacted.append((f.name, b))
                if any(m in b for m in SECRET_MARKS):
                    secret_marked.append((f.name, a, b))
    with capsys.disabled():
        print(f"\nfalse redaction on the draft corpus: {len(redacted)}/{total} lines "
              f"({len(redacted) / total:.2%}), {len(secret_marked)} with a secret's placeholder")
    assert total > 500
    assert not secret_marked, secret_marked                    # nothing that is not a secret reads as one
    assert len(redacted) / total < 0.02, redacted
    # what is redacted is a path or a URL (the site's names), never the code around it
    assert all(re.search(r"<(path|url|host)>", b) for _, b in redacted), redacted
