"""Which code a finding is about: the loader, loop, region, call or config key on the culprit's
path, located from the finding's evidence (the collector's recorded sites, the function and the
settings it names), never from what a draft chose to edit. Test files are never targets; when
several candidates fit and the evidence cannot tell them apart, there is no target and the reason
lists them."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path, PurePath

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from eroica.schema.diagnosis import Finding

SKIP_DIRS = {".git", ".venv", "venv", "node_modules", "__pycache__", "build", "dist", ".tox", "site-packages"}
CONFIG_SUFFIXES = (".yaml", ".yml", ".json", ".toml", ".cfg", ".ini")
MAX_FILES = 2000


@dataclass(frozen=True)
class Candidate:
    file: str           # relative to the repository
    line: int           # first line of the node (1-based)
    end_line: int
    text: str           # its first line, stripped

    def __str__(self) -> str:
        return f"{self.file}:{self.line} `{self.text[:80]}`"


@dataclass(frozen=True)
class Target:
    kind: str                                   # loader, loop, anomaly, anomaly_config, region, call, checkpoint
    found: Candidate | None
    why: str                                    # how it was chosen, or why nothing was
    candidates: list[Candidate] = field(default_factory=list)


def is_test(rel: str) -> bool:
    parts = PurePath(rel).parts
    name = parts[-1] if parts else ""
    return (any(p in ("tests", "test", "testing") for p in parts[:-1]) or name.startswith("test_")
            or name.endswith("_test.py") or name == "conftest.py")


def source_files(repo: Path, suffixes: tuple[str, ...] = (".py",)) -> list[str]:
    out = []
    for p in sorted(repo.rglob("*")):
        rel = p.relative_to(repo)
        if p.suffix not in suffixes or any(part in SKIP_DIRS for part in rel.parts) or not p.is_file():
            continue
        if not is_test(rel.as_posix()):
            out.append(rel.as_posix())
        if len(out) >= MAX_FILES:
            break
    return out


def parse(repo: Path, rel: str) -> tuple[MetadataWrapper, dict[cst.CSTNode, int], dict[cst.CSTNode, int]] | None:
    try:
        wrapper = MetadataWrapper(cst.parse_module((repo / rel).read_text()))
    except (OSError, UnicodeDecodeError, cst.ParserSyntaxError):
        return None
    pos = wrapper.resolve(PositionProvider)
    return wrapper, {n: p.start.line for n, p in pos.items()}, {n: p.end.line for n, p in pos.items()}


def dotted(node: cst.BaseExpression) -> str:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return f"{dotted(node.value)}.{node.attr.value}"
    if isinstance(node, cst.Call):
        return dotted(node.func) + "()"
    return ""


def callee(node: cst.Call) -> str:
    """The last name of what is called: `DataLoader` for `torch.utils.data.DataLoader(...)`."""
    return dotted(node.func).rsplit(".", 1)[-1]


def resolve_site(repo: Path, site: str | None) -> list[tuple[str, int]]:
    """A collector site `path:line < path:line ...` (innermost frame first) as the frames that are in
    this repository, each (repository-relative file, line), matched by the longest path suffix."""
    out: list[tuple[str, int]] = []
    for frame in (site or "").split(" < "):
        path, _, line = frame.strip().rpartition(":")
        if not line.isdigit():
            continue
        parts = tuple(x for x in PurePath(path).parts if x not in ("/", "\\") and not x.endswith(":\\"))
        for k in range(len(parts), 0, -1):
            rel = PurePath(*parts[-k:]).as_posix()
            if (repo / rel).is_file():
                out.append((rel, int(line)))
                break
    return out


class _Collect(cst.CSTVisitor):
    def __init__(self, want: object, start: dict[cst.CSTNode, int], end: dict[cst.CSTNode, int],
                 rel: str, lines: list[str]) -> None:
        self.want, self.start, self.end, self.rel, self.lines = want, start, end, rel, lines
        self.found: list[Candidate] = []
        self.defs: list[str] = []

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:  # noqa: N802
        self.defs.append(node.name.value)

    def leave_FunctionDef(self, node: cst.FunctionDef) -> None:  # noqa: N802
        self.defs.pop()

    def on_visit(self, node: cst.CSTNode) -> bool:
        super().on_visit(node)
        if node in self.start and self.want(node, self.defs):  # type: ignore[operator]
            s = self.start[node]
            self.found.append(Candidate(self.rel, s, self.end[node], self.lines[s - 1].strip()))
        return True


def collect(repo: Path, want: object, text_hint: str = "") -> list[Candidate]:
    """Every node `want(node, enclosing_defs)` accepts, in the repository's non-test Python files."""
    out: list[Candidate] = []
    for rel in source_files(repo):
        try:
            text = (repo / rel).read_text()
        except (OSError, UnicodeDecodeError):
            continue
        if text_hint and text_hint not in text:
            continue
        parsed = parse(repo, rel)
        if parsed is None:
            continue
        wrapper, start, end = parsed
        v = _Collect(want, start, end, rel, text.splitlines())
        wrapper.module.visit(v)
        out += v.found
    return out


def choose(kind: str, cands: list[Candidate], frames: list[tuple[str, int]] | None, what: str,
           outermost: bool = False) -> Target:
    """The candidate the evidence points at: the one holding the recorded site (its innermost frame
    that holds one), else the only one."""
    frames = [f for f in frames or [] if not is_test(f[0])]
    for rel, line in frames:
        holding = [c for c in cands if c.file == rel and c.line <= line <= c.end_line]
        if holding:
            span = (lambda c: -(c.end_line - c.line)) if outermost else (lambda c: c.end_line - c.line)
            c = min(holding, key=span)
            return Target(kind, c, f"the collector recorded {what} at {rel}:{line}", cands)
    for rel, line in frames[:1]:
        same = [c for c in cands if c.file == rel]
        if len(same) == 1:
            return Target(kind, same[0], f"the only {what} in {rel}, where the collector recorded it (line {line})",
                          cands)
    if len(cands) == 1:
        return Target(kind, cands[0], f"the only {what} in the repository (tests excluded)", cands)
    if not cands:
        return Target(kind, None, f"no {what} in the repository (tests excluded)", cands)
    return Target(kind, None, f"{len(cands)} candidates for the {what} and no recorded site to tell them apart: "
                  + "; ".join(map(str, cands[:8])), cands)


def _is_call(names: tuple[str, ...]) -> object:
    return lambda n, _d: isinstance(n, cst.Call) and callee(n) in names


def loader(repo: Path, f: Finding) -> Target:
    cands = collect(repo, _is_call(("DataLoader",)), "DataLoader") or \
        collect(repo, _is_call(("TrainingArguments",)), "TrainingArguments")    # HF: the Trainer builds it
    return choose("loader", cands, resolve_site(repo, f.sites.get("loader")), "data loader")


SAMPLERS = ("DistributedSampler",)


def sampler(repo: Path, f: Finding) -> Target:
    """Where the located data loader's samples are sharded: the DistributedSampler passed as its
    `sampler=` (inline, or the variable's last assignment above the loader in its function). Else the
    loader itself (a Trainer's TrainingArguments, a sampler passed in, or a loader that shards some other
    way)."""
    found = loader(repo, f)
    c = found.found
    parsed = parse(repo, c.file) if c is not None else None
    if c is None or parsed is None:
        return found
    _wrapper, start, end = parsed
    lines = (repo / c.file).read_text().splitlines()
    call = next((n for n, s in start.items() if s == c.line and isinstance(n, cst.Call) and callee(n) == "DataLoader"),
                None)
    arg = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == "sampler"),
               None) if call is not None else None
    node: cst.CSTNode | None = None
    if isinstance(arg, cst.Call) and callee(arg) in SAMPLERS:
        node = arg
    elif isinstance(arg, cst.Name):
        # in the loader's own function (a sampler of the same name in another function is another loader's)
        defs = [n for n in start if isinstance(n, cst.FunctionDef)]

        def function_of(line: int) -> cst.CSTNode | None:
            return min((d for d in defs if start[d] <= line <= end[d]), key=lambda d: end[d] - start[d], default=None)
        home = function_of(c.line)
        assigned = [n.value for n, s in start.items() if isinstance(n, cst.Assign) and s < c.line
                    and any(isinstance(t.target, cst.Name) and t.target.value == arg.value for t in n.targets)
                    and function_of(s) is home]
        last = max(assigned, key=lambda v: start[v], default=None)
        if isinstance(last, cst.Call) and callee(last) in SAMPLERS:
            node = last
    if node is None:
        return found
    s = start[node]
    here = Candidate(c.file, s, end[node], lines[s - 1].strip())
    return Target("sampler", here, f"the sampler of the data loader at {c}: {found.why}", [here])


def _calls_step(node: cst.CSTNode) -> bool:
    found = False

    class V(cst.CSTVisitor):
        def visit_Call(self, n: cst.Call) -> None:  # noqa: N802
            nonlocal found
            if callee(n) == "step" and isinstance(n.func, cst.Attribute):
                found = True
    node.visit(V())
    return found


def loop(repo: Path, f: Finding) -> Target:
    """The outermost loop whose body steps an optimizer (the training loop)."""
    cands = collect(repo, lambda n, _d: isinstance(n, (cst.For, cst.While)) and _calls_step(n), ".step(")
    outer = [c for c in cands if not any(o is not c and o.file == c.file and o.line < c.line <= o.end_line
                                         for o in cands)]
    frames = resolve_site(repo, f.sites.get("step"))
    if frames:     # the loop that holds the step's frames: a step inside a helper is called from the loop
        held = collect(repo, lambda n, _d: isinstance(n, (cst.For, cst.While)))
        outer += [c for c in held if c not in outer and any(c.file == r and c.line <= ln <= c.end_line
                                                              for r, ln in frames)]
    if outer:
        return choose("loop", outer, frames, "training loop", outermost=True)
    # no loop of the user's: a framework's trainer runs it (`trainer.train()`, `trainer.fit(...)`): the
    # statement that starts it is where the code before the loop goes
    runs = collect(repo, lambda n, _d: isinstance(n, cst.SimpleStatementLine) and _starts_trainer(n), "rainer")
    return choose("loop", runs, frames, "training loop (or trainer.train()/fit() call)")


TRAINER_RUN = re.compile(r"\b\w*[Tt]rainer\b.*\.(train|fit)\(")


def _starts_trainer(stmt: cst.SimpleStatementLine) -> bool:
    """One call statement on a trainer: `trainer.fit(model)`, `Trainer(...).train()`, `pl.Trainer(...).fit(m)`."""
    if len(stmt.body) != 1 or not isinstance(stmt.body[0], cst.Expr) or not isinstance(stmt.body[0].value, cst.Call):
        return False
    call = stmt.body[0].value
    return (isinstance(call.func, cst.Attribute) and call.func.attr.value in ("train", "fit")
            and TRAINER_RUN.search(cst.Module([]).code_for_node(call)) is not None)


def anomaly(repo: Path, f: Finding) -> Target:
    """The call that turns anomaly detection on, or the config key that feeds it."""
    def want(n: cst.CSTNode, _d: list[str]) -> bool:
        if isinstance(n, cst.SimpleStatementLine) and len(n.body) == 1 and isinstance(n.body[0], cst.Expr):
            e = n.body[0].value
            return (isinstance(e, cst.Call) and callee(e) == "set_detect_anomaly" and bool(e.args)
                    and isinstance(e.args[0].value, cst.Name) and e.args[0].value.value == "True")
        return isinstance(n, cst.With) and any(isinstance(i.item, cst.Call) and callee(i.item) == "detect_anomaly"
                                               for i in n.items)
    cands = collect(repo, want, "anomaly")
    if cands:
        return choose("anomaly", cands, None, "call that turns anomaly detection on")
    keys = config_keys(repo, r"detect_anomaly", r"(true|True|yes|on|1)")
    return choose("anomaly_config", keys, None, "config key that turns anomaly detection on")


def config_keys(repo: Path, key: str, value: str) -> list[Candidate]:
    rx = re.compile(rf"""^\s*["']?[\w.-]*{key}["']?\s*[:=]\s*["']?{value}["']?\s*,?\s*(#.*)?$""")
    out = []
    for rel in source_files(repo, CONFIG_SUFFIXES):
        try:
            lines = (repo / rel).read_text().splitlines()
        except (OSError, UnicodeDecodeError):
            continue
        out += [Candidate(rel, i + 1, i + 1, ln.strip()) for i, ln in enumerate(lines) if rx.match(ln)]
    return out


def _region_with(name: str) -> object:
    def want(n: cst.CSTNode, _d: list[str]) -> bool:
        return isinstance(n, cst.With) and any(
            isinstance(i.item, cst.Call) and callee(i.item) == "region" and i.item.args
            and isinstance(i.item.args[0].value, cst.SimpleString) and i.item.args[0].value.evaluated_value == name
            for i in n.items)
    return want


def region(repo: Path, f: Finding) -> Target:
    """The user region the finding names (`with mon.region("NAME")`), else the statement calling NAME."""
    name = f.function or ""
    if not name:
        return Target("region", None, "the finding names no function")
    cands = collect(repo, _region_with(name), name)
    if cands:
        return choose("region", cands, resolve_site(repo, f.sites.get(f"region.{name}")), f"region {name!r}")

    def call_stmt(n: cst.CSTNode, _d: list[str]) -> bool:
        return (isinstance(n, cst.SimpleStatementLine) and len(n.body) == 1 and isinstance(n.body[0], cst.Expr)
                and isinstance(n.body[0].value, cst.Call) and callee(n.body[0].value) == name)
    # a sampled user function's site: inside it, then where it was called from
    return choose("call", collect(repo, call_stmt, name), resolve_site(repo, f.sites.get(f"function.{name}")),
                  f"statement calling {name}()")


def for_model(repo: Path, f: Finding) -> Target:
    """Where a model may change code for a cause no template fixes (unknown, transient_stall): the
    function the finding names (a region or a sampled function's call), else the training loop."""
    if f.function and f.function != "untracked":
        named = region(repo, f)
        if named.found is not None:
            return named
    return loop(repo, f)


def recorded_stacks(repo: Path, f: Finding, most: int = 4) -> list[tuple[str, list[tuple[str, int, str]]]]:
    """The finding's recorded call sites that reach this repository: (site, [(file, line, source line)])
    innermost frame first, at most `most` sites."""
    out: list[tuple[str, list[tuple[str, int, str]]]] = []
    for name, site in sorted(f.sites.items()):
        frames = []
        for rel, line in resolve_site(repo, site)[:6]:
            lines = (repo / rel).read_text(errors="replace").splitlines()
            frames.append((rel, line, lines[line - 1].strip() if 0 < line <= len(lines) else ""))
        if frames:
            out.append((name, frames))
        if len(out) >= most:
            break
    return out


def checkpoint(repo: Path, f: Finding) -> Target:
    """The `torch.save` inside the function or region the finding names."""
    name = f.function or ""
    regions = collect(repo, _region_with(name), name) if name else []

    def want(n: cst.CSTNode, defs: list[str]) -> bool:
        return (isinstance(n, cst.SimpleStatementLine) and len(n.body) == 1 and isinstance(n.body[0], cst.Expr)
                and isinstance(n.body[0].value, cst.Call) and dotted(n.body[0].value.func) == "torch.save"
                and (name in defs or not name))
    saves = collect(repo, want, "torch.save")
    inside = [s for s in collect(repo, lambda n, d: want(n, [name]), "torch.save")
              if any(r.file == s.file and r.line <= s.line <= r.end_line for r in regions)]
    return choose("checkpoint", saves or inside, None, f"torch.save in {name or 'the checkpoint code'}")
