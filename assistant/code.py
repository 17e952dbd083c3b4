"""Finding the code a finding is about in a repository, and the offline (template) edits to it.

Edits are made on the source text at AST positions, so a diff touches only the lines it must.
"""

from __future__ import annotations

import ast
import difflib
from dataclasses import dataclass
from pathlib import Path

SKIP_DIRS = {".git", ".venv", "venv", "node_modules", "__pycache__", "build", "dist", ".tox"}
MAX_FILES = 2000


def python_files(repo: Path) -> list[Path]:
    out = []
    for p in sorted(repo.rglob("*.py")):
        if any(part in SKIP_DIRS for part in p.relative_to(repo).parts):
            continue
        out.append(p)
        if len(out) >= MAX_FILES:
            break
    return out


def _parse(path: Path) -> tuple[str, ast.Module] | None:
    try:
        text = path.read_text()
        return text, ast.parse(text)
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None


def unified_diff(repo: Path, path: Path, before: str, after: str) -> str:
    rel = path.relative_to(repo).as_posix()
    return "".join(difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                        fromfile=f"a/{rel}", tofile=f"b/{rel}"))


def _replace(text: str, node: ast.AST, new: str) -> str:
    lines = text.splitlines(keepends=True)
    start = sum(len(x) for x in lines[: getattr(node, "lineno") - 1]) + int(getattr(node, "col_offset"))
    end = sum(len(x) for x in lines[: int(getattr(node, "end_lineno")) - 1]) + int(getattr(node, "end_col_offset"))
    return text[:start] + new + text[end:]


@dataclass(frozen=True)
class Edit:
    path: Path
    before: str
    after: str


def dataloader_edit(repo: Path, workers: int, prefetch: int) -> list[Edit]:
    """Every `DataLoader(...)` call gets worker processes, prefetching and persistent workers."""
    edits = []
    for path in python_files(repo):
        parsed = _parse(path)
        if parsed is None or "DataLoader(" not in parsed[0]:
            continue
        text, tree = parsed
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and (
            getattr(n.func, "id", None) == "DataLoader" or getattr(n.func, "attr", None) == "DataLoader")]
        new = text
        for call in sorted(calls, key=lambda c: (c.lineno, c.col_offset), reverse=True):
            kw = {k.arg: k for k in call.keywords if k.arg}
            c = ast.parse(ast.get_source_segment(text, call) or "", mode="eval").body
            assert isinstance(c, ast.Call)
            ckw = {k.arg: k for k in c.keywords if k.arg}
            nw = kw.get("num_workers")
            if nw is None:
                c.keywords.append(ast.keyword("num_workers", ast.Constant(workers)))
            elif isinstance(nw.value, ast.Constant):
                ckw["num_workers"].value = ast.Constant(max(int(str(nw.value.value or 0)), workers))
            else:
                old = ckw["num_workers"].value
                ckw["num_workers"].value = ast.Call(ast.Name("max"), [old, ast.Constant(workers)], [])
            for name, value in (("prefetch_factor", prefetch), ("persistent_workers", True)):
                if name in ckw:
                    ckw[name].value = ast.Constant(value)
                else:
                    c.keywords.append(ast.keyword(name, ast.Constant(value)))
            if "cuda" in text and "pin_memory" not in ckw:
                c.keywords.append(ast.keyword("pin_memory", ast.Constant(True)))
            new = _replace(new, call, ast.unparse(c))
        if new != text:
            edits.append(Edit(path, text, new))
    return edits


def _calls_step(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Call) and getattr(n.func, "attr", None) == "step" for n in ast.walk(node))


def gc_freeze_edit(repo: Path) -> list[Edit]:
    """`gc.collect(); gc.freeze()` just before the first loop whose body calls `.step()`."""
    for path in python_files(repo):
        parsed = _parse(path)
        if parsed is None or ".step()" not in parsed[0]:
            continue
        text, tree = parsed
        loops = [n for n in ast.walk(tree) if isinstance(n, (ast.For, ast.While)) and _calls_step(n)]
        if not loops or "gc.freeze()" in text:
            continue
        loop = min(loops, key=lambda n: n.lineno)
        lines = text.splitlines(keepends=True)
        indent = lines[loop.lineno - 1][: loop.col_offset]
        ins = [f"{indent}gc.collect()  # eroica draft: long-lived objects (model, data) out of the collector's\n",
               f"{indent}gc.freeze()   # scans, so full collections inside the step scan only new objects\n"]
        lines[loop.lineno - 1:loop.lineno - 1] = ins
        if not any(isinstance(n, ast.Import) and any(a.name == "gc" for a in n.names) for n in tree.body):
            imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
            at = (imports[-1].end_lineno or 0) if imports else 0
            lines.insert(at, "import gc\n")
        return [Edit(path, text, "".join(lines))]
    return []


def relevant_code(repo: Path, names: list[str], context: int = 25, limit: int = 6000) -> dict[str, str]:
    """Only the code around the functions or calls a finding names (file -> excerpt), bounded."""
    out: dict[str, str] = {}
    used = 0
    for path in python_files(repo):
        parsed = _parse(path)
        if parsed is None:
            continue
        text, tree = parsed
        hits = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.Call)) and any(
            nm and nm in (getattr(n, "name", "") or ast.get_source_segment(text, n) or "")[:200] for nm in names)]
        if not hits:
            continue
        lines = text.splitlines()
        lo = max(min(h.lineno for h in hits) - context, 0)
        hi = min(max(h.end_lineno or h.lineno for h in hits) + context, len(lines))
        excerpt = "\n".join(lines[lo:hi])[: limit - used]
        out[path.relative_to(repo).as_posix()] = excerpt
        used += len(excerpt)
        if used >= limit:
            break
    return out
