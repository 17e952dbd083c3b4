"""The gate every draft passes before it is written, in a scratch copy of the repository (never the
user's checkout): the diff touches only the files the evidence located and deletes lines only
inside the located target; it applies (`git apply`); every touched Python file byte-compiles; its
syntax tree adds no process, network, deserialization, dynamic import, eval/exec, file deletion,
torch.distributed monkeypatch, write outside the repository or secret that was not there (a
deny-list: advice that catches the obvious, not a boundary); the repository's own validation command
passes under a timeout, in a sandbox (eroica.assistant.sandbox: no network, the system read-only,
only the scratch copy writable, no secrets in its environment, every process it starts killed at
the timeout). Each check is recorded, and a rejection says which one failed."""

from __future__ import annotations

import ast
import io
import os
import py_compile
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import tokenize
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from eroica.assistant import danger, sandbox
from eroica.assistant.models import Proposal
from eroica.assistant.targets import SKIP_DIRS

BIG_FILE_BYTES = 20 * 1024 * 1024           # not copied: shown read-only inside the sandbox
VALIDATE_TIMEOUT_SECONDS = 300.0
HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


@dataclass(frozen=True)
class Scope:
    """What the evidence located: per file, the line ranges a draft may change or delete."""

    lines: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    keys: frozenset[str] = frozenset()       # config keys the evidence names (recorded or found in the repo)
    keeps: frozenset[str] = frozenset()      # the work the finding names (a function): a draft may move it, not drop it

    def allows(self, rel: str, line: int) -> bool:
        return any(lo <= line <= hi for lo, hi in self.lines.get(rel, []))


@dataclass
class GateReport:
    checks: list[str] = field(default_factory=list)          # each check that ran, with its result
    refusal: str | None = None
    validation_output: str = ""

    def fail(self, why: str) -> GateReport:
        self.refusal = why
        return self


def touched_files(diff: str) -> list[str]:
    out = []
    for line in diff.splitlines():
        if line.startswith(("+++ ", "--- ")):
            name = line[4:].split("\t")[0].strip()
            if name != "/dev/null":
                name = name[2:] if name[:2] in ("a/", "b/") else name
                if name not in out:
                    out.append(name)
    return out


def _hunk_lines(diff: str) -> list[tuple[str, str, int, str]]:
    """(sign, file, the last old line before it (0: the top), text) of every removed ('-') and added
    ('+') line of a unified diff."""
    out, rel, old = [], "", 0
    for line in diff.splitlines():
        if line.startswith("--- "):
            rel = line[4:].split("\t")[0].strip().removeprefix("a/")
        elif line.startswith("+++ "):
            continue
        elif (m := HUNK.match(line)) is not None:
            old = int(m.group(1)) - (0 if m.group(2) == "0" else 1)   # `-N,0`: the insertion follows line N
        elif line.startswith("+"):
            out.append(("+", rel, old, line[1:]))
        elif line.startswith("-"):
            out.append(("-", rel, old, line[1:]))
            old += 1
        elif line.startswith(" ") or line == "":
            old += 1
    return out


def removed_lines(diff: str) -> list[tuple[str, int, str]]:
    """(file, old line number, text) of every line the diff deletes or rewrites."""
    return [(rel, after + 1, text) for sign, rel, after, text in _hunk_lines(diff) if sign == "-"]


def added_lines(diff: str) -> list[tuple[str, int, str]]:
    """(file, the old line it follows (0: the top), text) of every line the diff adds."""
    return [(rel, after, text) for sign, rel, after, text in _hunk_lines(diff) if sign == "+"]


HEADER_LINE = re.compile(r"^(import \S|from \S+ import |_\w+\s*(:\s*[\w\[\]., ]+)?\s*=|\s*$|#)")


def header_end(text: str) -> int:
    """The last line of a module's header: its docstring and top-level imports (0 when none)."""
    try:
        body = ast.parse(text).body
    except SyntaxError:
        return 0
    end = 0
    for i, node in enumerate(body):
        if isinstance(node, (ast.Import, ast.ImportFrom)) or (
                i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):
            end = node.end_lineno or node.lineno
        elif not isinstance(node, (ast.Assign, ast.AnnAssign)):   # module constants may sit between imports
            break
    return end


def misplaced(diff: str, repo: Path, scope: Scope) -> str | None:
    """Why an added line sits where the evidence did not reach, or copies a comment; None when none does.
    An added line must follow a line of the located target (or the line just before it), or be an import
    or a module-level helper in the file's header; a comment of the file's that it carries must come
    from a line the draft rewrites (the draft's own comments are new)."""
    texts: dict[str, str] = {}
    known: dict[str, set[str]] = {}          # each file's comments before the draft
    removed = Counter(c for _f, _n, t in removed_lines(diff) if (c := _comment(t)))
    added_comments: Counter[str] = Counter()
    for rel, after, text in added_lines(diff):
        if rel not in texts:
            texts[rel] = (repo / rel).read_text() if (repo / rel).is_file() else ""
            known[rel] = _comments(texts[rel])
        if not (scope.allows(rel, after) or scope.allows(rel, after + 1)
                or (after <= header_end(texts[rel]) and HEADER_LINE.match(text))):
            return f"the draft adds a line outside the located target, after {rel}:{after}: {text.strip()[:80]!r}"
        if (c := _comment(text)) and c in known[rel]:
            added_comments[c] += 1
            if added_comments[c] > removed[c]:
                return f"the draft copies the comment {c!r} onto a new line in {rel} (after line {after})"
    return None


def _comments(text: str) -> set[str]:
    return {c for line in text.splitlines() if "#" in line and (c := _comment(line))}


def _comment(line: str) -> str:
    """A line's comment (after `#` outside a string), stripped; '' when it has none."""
    try:
        toks = list(tokenize.generate_tokens(io.StringIO(line.strip() + "\n").readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return ""
    return next((t.string.lstrip("#").strip() for t in toks if t.type == tokenize.COMMENT), "")


def scratch_copy(repo: Path, into: Path) -> tuple[Path, dict[str, Path]]:
    """A copy of the repository to apply the draft to, and its files too big to copy (relative path ->
    the original), which the sandbox shows read-only in their place. Symbolic links are copied as
    links; nothing in the copy is a link into the user's checkout."""
    big: dict[str, Path] = {}
    root = repo.resolve()

    def ignore(d: str, names: list[str]) -> list[str]:
        return [n for n in names if n in SKIP_DIRS or n.endswith(".pyc")]

    def copy(src: str, dst: str) -> None:
        if os.path.getsize(src) > BIG_FILE_BYTES:
            big[str(Path(src).resolve().relative_to(root))] = Path(src).resolve()
            return
        shutil.copy2(src, dst)
    dst = into / "repo"
    shutil.copytree(repo, dst, ignore=ignore, symlinks=True, copy_function=copy)
    for rel in big:                       # the mount point the sandbox binds the original onto
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        (dst / rel).touch()
    return dst, big


def validation_command(repo: Path, given: str | None) -> str | None:
    """--validate, else `[tool.eroica] validate = "..."` in the repository's pyproject.toml."""
    if given:
        return given
    py = repo / "pyproject.toml"
    if py.is_file():
        try:
            import tomllib
        except ModuleNotFoundError:         # Python 3.10: the assistant extra installs tomli
            import tomli as tomllib  # type: ignore[no-redef]
        try:
            cfg = tomllib.loads(py.read_text())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError):
            return None
        v = cfg.get("tool", {}).get("eroica", {}).get("validate")
        return str(v) if v else None
    return None


def run_validation(cmd: str, repo: Path, cwd: Path, timeout: float, big: dict[str, Path] | None = None,
                   sandboxed: bool = True) -> sandbox.Result:
    argv = shlex.split(cmd)
    if argv and argv[0] in ("python", "python3"):
        argv[0] = sys.executable                   # the interpreter eroica runs in (the job's environment)
    return sandbox.run(argv, repo, cwd, timeout, big, sandboxed)


def _uses(text: str, name: str) -> int:
    """How often the module names `name` (called, passed or looked up: `f(x)`, `submit(f, x)`, `obj.f`)."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return 0
    return sum(1 for n in ast.walk(tree) if (isinstance(n, ast.Name) and n.id == name)
               or (isinstance(n, ast.Attribute) and n.attr == name))


def dropped(before: str, after: str, keeps: frozenset[str]) -> str | None:
    """The work the finding names that the draft deletes outright: no use of it is left in the file.
    Deleting the slow call is no fix (the metrics, the checkpoint are then gone); moving it off the
    step, or calling it less often, is."""
    gone = sorted(k for k in keeps if _uses(before, k) and not _uses(after, k))
    if not gone:
        return None
    return (f"the draft deletes every use of `{gone[0]}`, the work the finding names: a fix moves it off the step "
            "(a background thread, every N steps), it does not drop it")


def check_diff(diff: str, repo: Path, scope: Scope, validate: str | None = None,
               timeout: float = VALIDATE_TIMEOUT_SECONDS, sandboxed: bool = True) -> GateReport:
    r = GateReport()
    if not diff.strip():
        return r.fail("the draft is an empty diff")
    files = touched_files(diff)
    if not files:
        return r.fail("the draft is not a unified diff (no file headers)")
    stray = [f for f in files if f not in scope.lines]
    if stray:
        return r.fail(f"the draft touches files the evidence does not reach: {', '.join(stray)} "
                      f"(located: {', '.join(scope.lines) or 'none'})")
    r.checks.append(f"touches only the located file(s): {', '.join(files)}")
    outside = [(f, n, t) for f, n, t in removed_lines(diff) if not scope.allows(f, n)]
    if outside:
        f, n, t = outside[0]
        return r.fail(f"the draft deletes or rewrites {len(outside)} line(s) outside the located target, "
                      f"first {f}:{n} {t.strip()[:80]!r}")
    r.checks.append("deletes or rewrites lines only inside the located target")
    where = misplaced(diff, repo, scope)
    if where is not None:
        return r.fail(where)
    r.checks.append("adds lines only inside the located target or to the file's imports, copying no comment")
    with tempfile.TemporaryDirectory(prefix="eroica-gate-") as tmp:
        work, big = scratch_copy(repo, Path(tmp))
        patch = Path(tmp) / "draft.diff"
        patch.write_text(diff if diff.endswith("\n") else diff + "\n")
        try:
            res = subprocess.run(["git", "apply", "--whitespace=nowarn", str(patch)], cwd=work, capture_output=True,
                                 text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return r.fail(f"git apply could not run: {exc}")
        if res.returncode != 0:
            return r.fail(f"the diff does not apply (git apply): {res.stderr.strip()[:300]}")
        r.checks.append("applies with `git apply` in a scratch copy of the repository")
        for rel in files:
            if not rel.endswith(".py"):
                continue
            try:
                py_compile.compile(str(work / rel), cfile=str(Path(tmp) / "c.pyc"), doraise=True)
            except py_compile.PyCompileError as exc:
                return r.fail(f"{rel} does not compile after the draft: {str(exc.msg).strip()[-300:]}")
            before = (repo / rel).read_text() if (repo / rel).is_file() else ""
            after = (work / rel).read_text()
            new = danger.added(before, after)
            if new:
                return r.fail(f"the draft adds {new[0].kind} that was not there: {new[0]} in {rel}")
            gone = dropped(before, after, scope.keeps)
            if gone is not None:
                return r.fail(f"{gone} ({rel})")
        r.checks.append("every touched Python file byte-compiles and adds nothing on the deny-list (advice: process, "
                        "network, dynamic code, deletion, writes outside the repository, secrets)"
                        + (f"; still uses {', '.join(f'`{k}`' for k in sorted(scope.keeps))}" if scope.keeps else ""))
        cmd = validation_command(repo, validate)
        if cmd is None:
            r.checks.append("no validation command (--validate, or [tool.eroica] validate in pyproject.toml): "
                            "not run")
            return r
        why_not = sandbox.probe() if sandboxed else None
        if why_not is not None:
            return r.fail(f"the repository's validation `{cmd}` was not run: there is no sandbox for it ({why_not}); "
                          "it would run unreviewed code with your files and network (--unsandboxed-validation "
                          "runs it anyway)")
        ran = run_validation(cmd, repo, work, timeout, big, sandboxed)
        r.validation_output = ran.output
        if ran.code != 0:
            why = f"timed out after {timeout:.0f} s" if ran.code is None else f"exit {ran.code}"
            out = ran.output
            return r.fail(f"the repository's validation `{cmd}` failed on the draft ({why}): "
                          f"{out.strip().splitlines()[-1][:200] if out.strip() else 'no output'}")
        where = ("in a sandbox (no network, read-only system, only the copy writable, no secrets)" if sandboxed
                 else "WITHOUT a sandbox (--unsandboxed-validation)")
        r.checks.append(f"validation `{cmd}` passed on the draft in {ran.seconds:.1f} s (exit 0), {where}")
    return r


def check_config(p: Proposal, scope: Scope) -> GateReport:
    r = GateReport()
    if not p.config:
        return r.fail("the config change names no key")
    unknown = [c.key for c in p.config if c.key not in scope.keys]
    if unknown:
        return r.fail(f"the config change names keys the evidence does not: {', '.join(unknown)} "
                      f"(known: {', '.join(sorted(scope.keys)) or 'none'})")
    same = [c.key for c in p.config if c.before == c.after]
    if same:
        return r.fail(f"the config change does not change {', '.join(same)}")
    r.checks.append(f"names only keys the evidence names: {', '.join(c.key for c in p.config)}")
    return r


def check(p: Proposal, repo: Path | None, scope: Scope, validate: str | None = None,
          timeout: float = VALIDATE_TIMEOUT_SECONDS, sandboxed: bool = True) -> GateReport:
    if p.kind == "none":
        return GateReport().fail(p.rationale or "the backend proposed no change")
    if p.kind == "config":
        return check_config(p, scope)
    if repo is None:
        return GateReport().fail("a code change needs --repo to check that it applies")
    return check_diff(p.diff, repo, scope, validate, timeout, sandboxed)
