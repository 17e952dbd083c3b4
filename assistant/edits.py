"""The offline fixes, as concrete-syntax-tree edits (libcst) of exactly the target node: comments,
line breaks and quoting survive, and the diff touches only the lines that change (plus an import
or a module-level helper where the fix needs one). Each edit returns the new file text, or raises
`NotDrafted` with the reason a person must write it."""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from eroica.assistant.targets import SAMPLERS, Candidate, callee


class NotDrafted(Exception):
    """The target exists but this fix cannot be drafted on it safely (the message says why)."""


def unified_diff(rel: str, before: str, after: str) -> str:
    return "".join(difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                        fromfile=f"a/{rel}", tofile=f"b/{rel}"))


class _At(cst.CSTTransformer):
    """Calls `fn` on the outermost node of type `kind` that starts on `line` and that `accept`s; records
    whether it did. (Outermost: `DataLoader(TensorDataset(torch.randn(...)))` starts three calls on one
    line; `accept` names the one the evidence located.)"""

    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, kind: type, line: int, fn: Callable[[cst.CSTNode], cst.CSTNode | cst.FlattenSentinel],
                 accept: Callable[[cst.CSTNode], bool]) -> None:
        super().__init__()
        self.kind, self.line, self.fn, self.accept, self.done = kind, line, fn, accept, False
        self.chosen: cst.CSTNode | None = None

    def on_visit(self, node: cst.CSTNode) -> bool:
        if (self.chosen is None and isinstance(node, self.kind) and self.accept(node)
                and self.get_metadata(PositionProvider, node).start.line == self.line):
            self.chosen = node
        return super().on_visit(node)

    def on_leave(self, original: cst.CSTNode, updated: cst.CSTNode) -> Any:
        out = super().on_leave(original, updated)
        if original is self.chosen:
            self.done = True
            return self.fn(updated)
        return out


def edit_at(text: str, target: Candidate, kind: type, fn: Callable[[cst.CSTNode], cst.CSTNode | cst.FlattenSentinel],
            accept: Callable[[cst.CSTNode], bool] = lambda _n: True) -> cst.Module:
    t = _At(kind, target.line, fn, accept)
    module = MetadataWrapper(cst.parse_module(text)).visit(t)
    if not t.done:
        raise NotDrafted(f"{target}: the {kind.__name__} the evidence names is not on that line any more")
    return module


LOADER_CALLS = ("DataLoader", "TrainingArguments")


def _loader_call(node: cst.CSTNode) -> bool:
    return isinstance(node, cst.Call) and callee(node) in LOADER_CALLS


def _arg(name: str, value: str, like: cst.Arg | None) -> cst.Arg:
    eq = like.equal if like is not None and like.keyword is not None else cst.AssignEqual(
        whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))
    return cst.Arg(keyword=cst.Name(name), equal=eq, value=cst.parse_expression(value))


def set_kwargs(call: cst.Call, values: dict[str, str], keep: Callable[[str, cst.BaseExpression], str | None]
               ) -> cst.Call:
    """Set keyword arguments, keeping each existing argument's comma, comment and line; new ones are
    appended in the style of the call's own separators (one per line in a multi-line call)."""
    args = list(call.args)
    names = {a.keyword.value: i for i, a in enumerate(args) if a.keyword is not None}
    for k, v in values.items():
        if k in names:
            new = keep(k, args[names[k]].value)
            if new is not None:
                args[names[k]] = args[names[k]].with_changes(value=cst.parse_expression(new))
    missing = [k for k in values if k not in names]
    if not missing:
        return call.with_changes(args=args)
    kw_like = next((a for a in args if a.keyword is not None), None)
    if len(args) >= 2 and isinstance(args[-2].comma, cst.Comma):
        sep = args[-2].comma
        if isinstance(sep.whitespace_after, cst.ParenthesizedWhitespace):   # its line break, not its comment
            sep = sep.with_changes(whitespace_after=sep.whitespace_after.with_changes(
                first_line=cst.TrailingWhitespace(newline=sep.whitespace_after.first_line.newline)))
    else:
        sep = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    tail = args[-1].comma if args else cst.MaybeSentinel.DEFAULT
    if args:
        tw = tail.whitespace_after if isinstance(tail, cst.Comma) else None
        sw = sep.whitespace_after
        if isinstance(tw, cst.ParenthesizedWhitespace) and isinstance(sw, cst.ParenthesizedWhitespace):
            # one argument per line with a trailing comma: the old last keeps its comment and its line;
            # the new last takes the trailing comma and the closing bracket's indentation
            args[-1] = args[-1].with_changes(comma=tail.with_changes(  # type: ignore[union-attr]
                whitespace_after=tw.with_changes(indent=sw.indent, last_line=sw.last_line)))
            tail = tail.with_changes(whitespace_after=tw.with_changes(  # type: ignore[union-attr]
                first_line=cst.TrailingWhitespace(newline=tw.first_line.newline)))
        else:
            args[-1] = args[-1].with_changes(comma=sep)
    new_args = [_arg(k, values[k], kw_like).with_changes(comma=sep) for k in missing]
    new_args[-1] = new_args[-1].with_changes(comma=tail)
    return call.with_changes(args=[*args, *new_args])


def _int(expr: cst.BaseExpression) -> int | None:
    return int(expr.value) if isinstance(expr, cst.Integer) else None


def loader_kwargs(text: str, target: Candidate, workers: int, prefetch: int, pin: bool) -> str:
    """Worker processes, prefetching and persistent workers on the one loader the evidence names."""
    hf = target.text.lstrip().find("TrainingArguments") >= 0
    names = ({"num_workers": "dataloader_num_workers", "prefetch_factor": "dataloader_prefetch_factor",
              "persistent_workers": "dataloader_persistent_workers", "pin_memory": "dataloader_pin_memory"}
             if hf else {k: k for k in ("num_workers", "prefetch_factor", "persistent_workers", "pin_memory")})

    def keep(k: str, old: cst.BaseExpression) -> str | None:
        if k == names["num_workers"]:
            n = _int(old)
            if n is None:
                return f"max({cst.Module([]).code_for_node(old)}, {workers})"
            return None if n >= workers else str(workers)
        if k == names["prefetch_factor"]:
            n = _int(old)
            return None if n is not None and n >= prefetch else str(prefetch)
        return "True"

    values = {names["num_workers"]: str(workers), names["prefetch_factor"]: str(prefetch),
              names["persistent_workers"]: "True"}
    if pin:
        values[names["pin_memory"]] = "True"
    return edit_at(text, target, cst.Call, lambda n: set_kwargs(n, values, keep),  # type: ignore[arg-type]
                   _loader_call).code


def balanced_sampler(text: str, target: Candidate) -> str:
    """The same work per rank per step. A DistributedSampler with `shuffle=False` fixes each rank's shard
    by index (rank r takes samples r, r+W, r+2W, ...): any period in the dataset's order that matches the
    world size (sources interleaved round-robin, one of them longer) lands on one rank every step, the
    persistent single-rank skew the finding shows; shuffling spreads it. A Trainer buckets its samples by
    length. Otherwise: at the same batch size a rank with more work per step holds longer (or bigger)
    samples, so equalizing sample counts (drop_last) would change nothing; for a plain DataLoader a person
    chooses the bucketing (a length-grouped batch sampler, a token budget per batch): nothing is drafted."""
    def fix(n: cst.CSTNode) -> cst.CSTNode:
        assert isinstance(n, cst.Call)
        if callee(n) in SAMPLERS:
            shuffle = next((a.value for a in n.args if a.keyword is not None and a.keyword.value == "shuffle"), None)
            if not (isinstance(shuffle, cst.Name) and shuffle.value == "False"):
                raise NotDrafted("the data loader's DistributedSampler already shuffles (or its shuffle is computed): "
                                 "its shards are not fixed by index; bucket the samples by length or cap the tokens "
                                 "per batch, which a person must choose")
            return set_kwargs(n, {"shuffle": "True"}, lambda k, o: "True")
        if callee(n) != "TrainingArguments":
            raise NotDrafted("at the same batch size, a rank with more work per step holds longer or bigger samples: "
                             "equal sample counts (DistributedSampler, drop_last) would not balance them; bucket "
                             "the samples by length or cap the tokens per batch, which a person must choose")
        kv = ("train_sampling_strategy", '"group_by_length"') if _transformers_major() >= 5 else \
            ("group_by_length", "True")
        return set_kwargs(n, dict([kv]), lambda k, o: kv[1])
    # a sampler inline in the loader's call starts on the loader's line: the sampler is the one located
    calls = SAMPLERS if any(f"{s}(" in target.text for s in SAMPLERS) else LOADER_CALLS
    return edit_at(text, target, cst.Call, fix, lambda n: isinstance(n, cst.Call) and callee(n) in calls).code


def _transformers_major() -> int:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return int(version("transformers").split(".")[0])
    except (PackageNotFoundError, ValueError):
        return 0


def ensure_imports(module: cst.Module, imports: Sequence[str], helpers: Sequence[str] = ()) -> cst.Module:
    """Add the import lines (and module-level helper lines) that are not there, after the last
    top-level import, keeping everything else byte for byte."""
    code = module.code
    need = [i for i in imports if not re.search(rf"^{re.escape(i)}\s*(#.*)?$", code, re.M)]
    need += [h for h in helpers if h.split("=")[0].strip() + " =" not in code]
    if not need:
        return module
    body = list(module.body)
    at = 0
    for i, stmt in enumerate(body):
        if isinstance(stmt, cst.SimpleStatementLine) and all(isinstance(s, (cst.Import, cst.ImportFrom))
                                                             for s in stmt.body):
            at = i + 1
        elif at == 0 and isinstance(stmt, cst.SimpleStatementLine) and isinstance(stmt.body[0], cst.Expr) \
                and isinstance(stmt.body[0].value, cst.SimpleString):
            at = i + 1                                   # after the module docstring
    new = [cst.parse_statement(line + "\n") for line in need]
    return module.with_changes(body=[*body[:at], *new, *body[at:]])


def _statements(block: cst.BaseSuite) -> list[cst.BaseStatement]:
    return list(block.body) if isinstance(block, cst.IndentedBlock) else \
        [cst.SimpleStatementLine(body=list(block.body))]  # type: ignore[arg-type]


class _Splice(cst.CSTTransformer):
    """Replace the statement on `line` with `new(stmt)` (a list: empty removes it; a block left
    empty gets `pass`)."""

    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, line: int, kind: type, new: Callable[[cst.BaseStatement], list[cst.BaseStatement]]) -> None:
        super().__init__()
        self.line, self.kind, self.new, self.done = line, kind, new, False
        self.origin: dict[int, int] = {}
        self.leftover: list[cst.EmptyLine] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, self.kind):
            self.origin[id(node)] = self.get_metadata(PositionProvider, node).start.line
        return True

    def _body(self, body: Sequence[cst.BaseStatement], originals: Sequence[cst.BaseStatement]
              ) -> list[cst.BaseStatement]:
        out: list[cst.BaseStatement] = []
        carry: list[cst.EmptyLine] = []          # a removed statement's blank lines and comments stay
        for new, old in zip(body, originals, strict=True):
            if not self.done and self.origin.get(id(old)) == self.line:
                self.done = True
                repl = self.new(new)
                if not repl:
                    carry = list(getattr(new, "leading_lines", ()))
                out += repl
            elif carry:
                out.append(new.with_changes(leading_lines=[*carry, *getattr(new, "leading_lines", ())]))
                carry = []
            else:
                out.append(new)
        self.leftover = carry                    # the block's last statement went: its lines end the block
        return out

    def leave_IndentedBlock(self, original: cst.IndentedBlock, updated: cst.IndentedBlock  # noqa: N802
                            ) -> cst.IndentedBlock:
        body = self._body(updated.body, original.body)
        footer = [*self.leftover, *updated.footer]
        return updated.with_changes(body=body or [cst.SimpleStatementLine([cst.Pass()])], footer=footer)

    def leave_Module(self, original: cst.Module, updated: cst.Module) -> cst.Module:  # noqa: N802
        body = self._body(updated.body, original.body)
        return updated.with_changes(body=body, footer=[*self.leftover, *updated.footer])


def splice(text: str, target: Candidate, kind: type, new: Callable[[cst.BaseStatement], list[cst.BaseStatement]]
           ) -> cst.Module:
    t = _Splice(target.line, kind, new)
    module = MetadataWrapper(cst.parse_module(text)).visit(t)
    if not t.done:
        raise NotDrafted(f"{target}: the statement the evidence names is not on that line any more")
    return module


def anomaly_off(text: str, target: Candidate) -> str:
    """Remove `set_detect_anomaly(True)`, or unwrap `with detect_anomaly():` (its body stays)."""
    if target.text.startswith("with"):
        def unwrap(w: cst.BaseStatement) -> list[cst.BaseStatement]:
            body = _statements(w.body)  # type: ignore[attr-defined]
            lead = [*getattr(w, "leading_lines", ()), *getattr(body[0], "leading_lines", ())]
            return [body[0].with_changes(leading_lines=lead), *body[1:]]
        return splice(text, target, cst.With, unwrap).code
    return splice(text, target, cst.SimpleStatementLine, lambda _s: []).code


def config_off(text: str, target: Candidate) -> str:
    lines = text.splitlines(keepends=True)
    ln = lines[target.line - 1]
    new = re.sub(r"([:=]\s*[\"']?)(true|True|yes|on|1)\b", lambda m: m.group(1) + {
        "true": "false", "True": "False", "yes": "no", "on": "off", "1": "0"}[m.group(2)], ln, count=1)
    if new == ln:
        raise NotDrafted(f"{target}: the value could not be turned off in place")
    lines[target.line - 1] = new
    return "".join(lines)


def gc_freeze(text: str, target: Candidate, gen0: int) -> str:
    """Before the training loop: collect, freeze what is alive (model, data), raise gen0's threshold."""
    def before(loop: cst.BaseStatement) -> list[cst.BaseStatement]:
        first = cst.parse_statement("gc.collect()  # eroica draft: long-lived objects (model, data) leave the\n")
        return [first.with_changes(leading_lines=getattr(loop, "leading_lines", ())),
                cst.parse_statement("gc.freeze()   # collector's scans; collections inside the step see new objects\n"),
                cst.parse_statement(f"gc.set_threshold({gen0}, *gc.get_threshold()[1:])  # fewer gen-0 passes\n"),
                loop.with_changes(leading_lines=[])]
    if "gc.freeze()" in text:
        raise NotDrafted("the code already calls gc.freeze()")
    head = target.text.lstrip()
    kind = cst.While if head.startswith("while") else cst.For if head.startswith(("for ", "async for ")) \
        else cst.SimpleStatementLine                   # a trainer's train()/fit() call runs the loop
    return ensure_imports(splice(text, target, kind, before), ["import gc"]).code


EXECUTOR = ('_eroica_background = concurrent.futures.ThreadPoolExecutor(max_workers=1, '
            'thread_name_prefix="eroica-draft")  # eroica draft: blocking calls leave the step')


def to_background(text: str, target: Candidate) -> str:
    """The blocking calls of a region (or the one call statement) run on a background thread; their
    arguments are still evaluated in the step, so they see the same values."""
    def submit(stmt: cst.BaseStatement) -> cst.BaseStatement:
        if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Expr)
                and isinstance(stmt.body[0].value, cst.Call)):
            raise NotDrafted(f"{target}: the region holds more than call statements (assignments or control "
                             "flow): moving it needs a person")
        call = stmt.body[0].value
        new = call.with_changes(func=cst.parse_expression("_eroica_background.submit"),
                                args=[cst.Arg(call.func, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
                                      if call.args else cst.Arg(call.func), *call.args])
        return stmt.with_changes(body=[stmt.body[0].with_changes(value=new)])

    if target.text.startswith("with"):
        def region(w: cst.BaseStatement) -> list[cst.BaseStatement]:
            assert isinstance(w, cst.With) and isinstance(w.body, cst.IndentedBlock)
            return [w.with_changes(body=w.body.with_changes(body=[submit(s) for s in w.body.body]))]
        module = splice(text, target, cst.With, region)
    else:
        module = splice(text, target, cst.SimpleStatementLine, lambda s: [submit(s)])
    return ensure_imports(module, ["import concurrent.futures"], [EXECUTOR]).code


def async_checkpoint(text: str, target: Candidate) -> str:
    """`torch.save(state, path)` -> the state serialized by the same torch.save into memory in the step,
    and the bytes written to the same path on a background thread, one save in flight: the file, its
    format and its path stay what they were (a collective torch.distributed.checkpoint.async_save would
    change all three and need every rank to call it)."""
    def swap(stmt: cst.BaseStatement) -> list[cst.BaseStatement]:
        assert isinstance(stmt, cst.SimpleStatementLine) and isinstance(stmt.body[0], cst.Expr)
        call = stmt.body[0].value
        assert isinstance(call, cst.Call)
        if len(call.args) < 2 or any(a.keyword is not None for a in call.args[:2]):
            raise NotDrafted(f"{target}: torch.save is not called as torch.save(state, path)")
        m = cst.Module([])
        state, path = m.code_for_node(call.args[0].value), m.code_for_node(call.args[1].value)
        return [cst.parse_statement("if _EROICA_SAVES:  # eroica draft: one checkpoint in flight; wait for the last\n"
                                    "    _EROICA_SAVES.pop().result()\n").with_changes(
                                        leading_lines=stmt.leading_lines),
                cst.parse_statement("_eroica_buffer = io.BytesIO()  # eroica draft: serialized in the step, "
                                    "written to disk in the background\n"),
                cst.parse_statement(f"torch.save({state}, _eroica_buffer)\n"),
                cst.parse_statement(f"_EROICA_SAVES.append(_eroica_background.submit(pathlib.Path({path}).write_bytes, "
                                    f"_eroica_buffer.getbuffer()))\n")]
    module = splice(text, target, cst.SimpleStatementLine, swap)
    return ensure_imports(module, ["import concurrent.futures", "import io", "import pathlib"],
                          [EXECUTOR, "_EROICA_SAVES: list = []  # eroica draft: pending checkpoint writes"]).code


def read(repo: Path, rel: str) -> str:
    return (repo / rel).read_text()
