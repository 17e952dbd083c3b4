"""Redaction as a property: generated secrets of every kind, inside code-like text, never survive
into what is sent to a model, and code that is not a secret stays readable."""

from __future__ import annotations

import string
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eroica.assistant.errors import DraftInputError
from eroica.assistant.redact import Redactor, load_pattern_file

word = st.text(string.ascii_lowercase + string.digits, min_size=3, max_size=10).filter(lambda s: s[0].isalpha())
alnum = st.text(string.ascii_letters + string.digits, min_size=24, max_size=40)
upper = st.text(string.ascii_uppercase + string.digits, min_size=16, max_size=16)
hexd = st.text("0123456789abcdef", min_size=1, max_size=4)

secrets = st.one_of(
    st.builds(lambda b, k: f"s3://{b}-ml-prod/{k}/ckpt.pt", word, word),
    st.builds(lambda b, k: f"gs://{b}/{k}", word, word),
    st.builds(lambda a, b, k: f"abfss://{a}@{b}.dfs.core.windows.net/{k}", word, word, word),
    st.builds(lambda a, b: f"/lustre/{a}/{b}", word, word),
    st.builds(lambda a, b: f"/fsx/{a}/{b}.bin", word, word),
    st.builds(lambda a, b: f"/{a}/{b}", word, word),                       # any root, not a fixed list
    st.builds(lambda a: f"~/{a}/.netrc", word),
    st.builds(lambda n, d: f"gpu-node-{n:04d}.{d}.internal", st.integers(0, 9999), word),
    st.builds(lambda n: f"dgx{n:03d}", st.integers(0, 999)),
    st.builds(lambda a, b, c, d: f"ip-10-{a}-{b}-{c}.ec2.internal", st.integers(0, 255), st.integers(0, 255),
              st.integers(0, 255), st.just(0)),
    st.builds(lambda a, b, c: f"2001:db8:{a}::{b}:{c}", hexd, hexd, hexd),
    st.builds(lambda a, b, c, d: f"{a}.{b}.{c}.{d}", st.integers(1, 255), st.integers(0, 255), st.integers(0, 255),
              st.integers(1, 254)),
    st.builds(lambda t: f"hf_{t}", alnum),
    st.builds(lambda t: f"ghp_{t}", alnum),
    st.builds(lambda t: f"sk-{t}", alnum),
    st.builds(lambda t: f"AKIA{t}", upper),
    st.builds(lambda t: f"xoxb-{t}", alnum),
    st.builds(lambda h, p: f"https://{h}.corp/{p}", word, word),
    st.builds(lambda h, p: f"http://{h}:8080/{p}", word, word),
    st.builds(lambda u, h: f"{u}@{h}.com", word, word),
    st.builds(lambda t: f"{t}Zq7", st.text(string.ascii_letters + string.digits, min_size=28, max_size=40)
              .filter(lambda s: sum(c.isdigit() for c in s) >= 4 and sum(c.isalpha() for c in s) >= 8
                      and len(set(s)) >= 14)),
)
prefix = st.sampled_from(["path = '", "x = load(\"", "# see ", "url=", "    host: ", "(", "[", "token = '"])
suffix = st.sampled_from(["'", "\")", "", " for the run", ")", "]", "\n"])


@settings(max_examples=400, deadline=None)
@given(secret=secrets, before=prefix, after=suffix)
def test_no_generated_secret_survives_redaction(secret: str, before: str, after: str) -> None:
    text = f"def load(step):\n    {before}{secret}{after}\n    return step\n"
    out = Redactor()(text)
    assert secret not in out, out
    assert "def load(step):" in out and "return step" in out


@settings(max_examples=100, deadline=None)
@given(site=st.lists(st.from_regex(r"[a-z]{3,8}-[0-9]{2,4}", fullmatch=True), min_size=1, max_size=3))
def test_the_site_patterns_and_the_diagnosis_hosts_win(site: list[str]) -> None:
    r = Redactor(hostnames=["vm"], extra=[r"project-(?:alpha|beta)"])
    out = r(f"on vm: project-alpha {' '.join(site)}")
    assert "project-alpha" not in out and " vm" not in out
    assert r.replaced["<redacted>"] == 1


def test_code_stays_readable() -> None:
    code = ("loader = DataLoader(ds, batch_size=32, num_workers=4)  # 4 workers\n"
            "x = a / b + c // 2; y = x[::2]; z = (a)/b\n"
            "torch.distributed.checkpoint.async_save(state, checkpoint_id=path)\n"
            "persistent_workers_enabled_for_training = True; ratio = 1:2\n")
    assert Redactor()(code) == code


def test_a_site_pattern_file_is_read_and_a_bad_line_is_named(tmp_path: Path) -> None:
    f = tmp_path / "redact.txt"
    f.write_text("# our project names\nproject-(alpha|beta)\n\n")
    assert load_pattern_file(f) == ["project-(alpha|beta)"]
    f.write_text("ok\nbad(\n")
    with pytest.raises(DraftInputError, match=r"redact.txt:2: not a regular expression"):
        load_pattern_file(f)


MISSED_BEFORE = [
    # (text, what must not survive, what must)
    ('DB_PASSWORD = "Tr0ub4dor&3"\n', "Tr0ub4dor&3", "DB_PASSWORD = "),
    ('    api_key = "hunter2hunter2"\n', "hunter2hunter2", "api_key = "),
    ('cfg = {"client_secret": "abc12", "lr": 3e-4}\n', "abc12", '"lr": 3e-4'),
    ("export HF_TOKEN=plainword\n", "plainword", "export HF_TOKEN="),
    ("db:\n  password: s3cr3t\n", "s3cr3t", "db:"),
    ("engine = connect('prodbox3.example.com', 5432)\n", "prodbox3", "engine = connect("),
    ("# logs go to metrics.bigbank.co.uk\n", "bigbank", "# logs go to"),
    ('ds = load_dataset("json", data_files="data/acme_corp/train.jsonl")\n', "acme_corp", "data/"),
    ('ckpt = "checkpoints/contoso-llm-7b/step_100.pt"\n', "contoso", ".pt"),
]


@pytest.mark.parametrize(("text", "gone", "kept"), MISSED_BEFORE, ids=[m[1] for m in MISSED_BEFORE])
def test_what_redaction_missed_before_is_gone_and_the_code_around_it_stays(text: str, gone: str, kept: str) -> None:
    out = Redactor()(text)
    assert gone not in out and kept in out, out


def test_module_paths_public_hosts_and_ordinary_code_are_not_hosts_or_paths() -> None:
    code = ("import torchvision.io\nx = tf.io.gfile.exists(p)\ntoken = tokenizer(x)\nmax_tokens = 512\n"
            'pad_token = "[PAD]"\nsee https://pytorch.org/docs and docs.pytorch.org and example.com\n'
            "loss = total/count\ny = a/b.mean()\nopen('README.md')\nsave(model, 'model.pt')\n"
            'DB_PASSWORD = os.environ["DB_PASSWORD"]\n')
    assert Redactor()(code) == code


def test_a_bad_redact_pattern_from_the_environment_or_the_flag_is_named_before_anything_is_written(
        tmp_path: Path, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from eroica.cli.main import main

    incident = Path(__file__).parents[2] / "incidents" / "INC-0001" / "patterns"
    assert main(["diagnose", str(incident), "--format", "json", "-o", str(tmp_path / "d.json")]) == 0
    bad = tmp_path / "redact.txt"
    bad.write_text("ok\nfoo(bar\n")
    monkeypatch.setenv("EROICA_REDACT_FILE", str(bad))
    capsys.readouterr()
    assert main(["draft", str(tmp_path / "d.json"), "-o", str(tmp_path / "a")]) == 2
    assert f"{bad}:2: not a regular expression" in capsys.readouterr().out
    monkeypatch.delenv("EROICA_REDACT_FILE")
    assert main(["draft", str(tmp_path / "d.json"), "--redact", "a[b", "-o", str(tmp_path / "b")]) == 2
    assert "--redact 'a[b': not a regular expression" in capsys.readouterr().out
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
