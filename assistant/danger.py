"""What a draft must not add, read on the syntax tree (not by regex, so `importlib.import_module('o'+'s')`
or an alias cannot hide it): process, network and deserialization modules and their calls (every
`os.exec*`, `os.spawn*`, `os.posix_spawn*`, `os.fork*`), dynamic imports, eval/exec, attributes
looked up by a computed name (`getattr(os, 'sys' + 'tem')`), reaching into the builtins
(`vars(__builtins__)['ex' + 'ec']`), file deletion, writes to a path outside the repository
(`open('~/.bashrc', 'a')`), monkeypatching torch.distributed, and literal secrets. The gate compares
the signatures of each touched file before and after the draft; any new one rejects it.

This is a deny-list, and a deny-list is advice: it catches the obvious and names it in the change
request. What contains a draft is the sandbox its validation runs in (eroica.assistant.sandbox)."""

from __future__ import annotations

import ast
import re
from collections import Counter
from dataclasses import dataclass

MODULES = {
    "process": ("subprocess", "pty", "multiprocessing", "ctypes", "cffi", "signal"),
    "network": ("socket", "requests", "urllib", "http", "httpx", "aiohttp", "ftplib", "smtplib", "telnetlib",
                "paramiko", "websocket", "websockets", "xmlrpc", "webbrowser", "boto3", "botocore"),
    "deserialization": ("pickle", "cPickle", "_pickle", "dill", "marshal", "shelve", "cloudpickle", "joblib"),
    "dynamic import": ("importlib", "builtins", "imp", "runpy"),
}
CALLS = {
    "eval/exec": ("eval", "exec", "compile", "__import__", "execfile"),
    "a shell-out": ("os.system", "os.popen", "os.execv", "os.execve", "os.execl", "os.execlp", "os.execvp",
                    "os.spawnl", "os.spawnv", "os.fork", "os.kill", "os.killpg", "pty.spawn"),
    "file deletion": ("os.remove", "os.unlink", "os.rmdir", "os.removedirs", "shutil.rmtree", "shutil.move",
                      "os.truncate"),
    "unsafe deserialization": ("yaml.load", "yaml.unsafe_load", "numpy.load", "np.load"),
}
DELETING_METHODS = ("unlink", "rmdir", "rmtree")           # Path(...).unlink() and friends
OS_PROCESS_PREFIXES = ("os.exec", "os.spawn", "os.posix_spawn", "os.fork", "os.startfile")
MODULE_NAMES = {m for mods in MODULES.values() for m in mods} | {"os", "sys", "shutil", "io", "pathlib", "__builtins__"}
DUNDER_ESCAPES = ("__globals__", "__subclasses__", "__builtins__", "__code__", "__getattribute__", "__loader__")
WRITE_MODES = set("wax+")
OPENERS = ("open", "io.open", "os.open", "codecs.open")
PATH_WRITERS = ("write_text", "write_bytes", "open", "touch", "mkdir", "symlink_to", "hardlink_to")
SECRET = re.compile(r"(AKIA[0-9A-Z]{16}|ASIA[0-9A-Z]{16}|-----BEGIN [A-Z ]*PRIVATE KEY|sk-[A-Za-z0-9_-]{20,}|"
                    r"gh[pousr]_[A-Za-z0-9]{20,}|hf_[A-Za-z0-9]{20,}|xox[abp]-[A-Za-z0-9-]{10,}|"
                    r"glpat-[A-Za-z0-9_-]{20,}|AIza[0-9A-Za-z_-]{30,})")
SECRET_NAMES = re.compile(r"(api[_-]?key|secret|password|passwd|token|credential)", re.IGNORECASE)


@dataclass(frozen=True)
class Danger:
    kind: str           # "network", "file deletion", ...
    what: str           # the module, call or assignment
    line: int

    def __str__(self) -> str:
        return f"{self.kind}: {self.what} (line {self.line})"


def _dotted(node: ast.AST, aliases: dict[str, str]) -> str:
    if isinstance(node, ast.Name):
        return aliases.get(node.id, node.id)
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value, aliases)
        return f"{base}.{node.attr}" if base else ""
    if isinstance(node, ast.Call):
        return _dotted(node.func, aliases)
    return ""


def _module_kind(name: str) -> str | None:
    top = name.split(".")[0]
    return next((k for k, mods in MODULES.items() if top in mods), None)


def _outside(node: ast.AST | None) -> bool:
    """A path literal that leaves the repository: absolute, home-relative or climbing (`..`), also
    when wrapped in os.path.expanduser/abspath or Path(...)."""
    if isinstance(node, ast.Call) and node.args:
        return _outside(node.args[0])
    if isinstance(node, ast.JoinedStr) and node.values:
        return _outside(node.values[0])
    if isinstance(node, ast.BinOp):          # Path('/etc') / 'x'
        return _outside(node.left)
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        v = node.value
        return v.startswith(("/", "~", "$HOME", "\\")) or ".." in v.replace("\\", "/").split("/")
    return False


def _write_mode(call: ast.Call, pos: int) -> bool:
    mode = call.args[pos] if len(call.args) > pos else next((k.value for k in call.keywords if k.arg == "mode"), None)
    if isinstance(mode, ast.Constant) and isinstance(mode.value, str):
        return bool(WRITE_MODES & set(mode.value))
    return mode is not None                  # a computed mode, or os.open's flags: assume it writes


def _special(node: ast.Call, name: str, aliases: dict[str, str]) -> str | None:
    """The kinds a call's name alone does not tell: computed attribute names, builtins reached
    through vars/globals, writes outside the repository."""
    if name in ("getattr", "setattr", "delattr") and len(node.args) >= 2:
        obj, attr = _dotted(node.args[0], aliases), node.args[1]
        if not (isinstance(attr, ast.Constant) and isinstance(attr.value, str)):
            if obj.split(".")[0] in MODULE_NAMES or not isinstance(attr, ast.Name):
                return "a computed attribute name"
        elif obj:
            target = f"{obj}.{attr.value}"
            if any(target in calls for calls in CALLS.values()) or target.startswith(OS_PROCESS_PREFIXES):
                return "a shell-out" if target.startswith("os.") else "eval/exec"
    if name in OPENERS and node.args and _outside(node.args[0]) and _write_mode(node, 1):
        return "a write outside the repository"
    if isinstance(node.func, ast.Attribute) and node.func.attr in PATH_WRITERS and _outside(node.func.value):
        if node.func.attr != "open" or _write_mode(node, 0):
            return "a write outside the repository"
    return None


def scan(tree: ast.Module) -> list[Danger]:
    """Every dangerous construct in a module, with its line."""
    aliases: dict[str, str] = {}
    out: list[Danger] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[(a.asname or a.name).split(".")[0] if not a.asname else a.asname] = \
                    a.name if a.asname else a.name.split(".")[0]
                if (k := _module_kind(a.name)) is not None:
                    out.append(Danger(k, f"import {a.name}", node.lineno))
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
            if (k := _module_kind(node.module)) is not None:
                out.append(Danger(k, f"from {node.module} import ...", node.lineno))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _dotted(node.func, aliases)
            if not name:
                continue
            kind = next((k for k, calls in CALLS.items() if name in calls or name.split(".")[-1] in calls
                         and k == "eval/exec" and "." not in name), None)
            if kind is None and name.startswith(OS_PROCESS_PREFIXES):
                kind = "a shell-out"
            if kind is None:
                kind = _special(node, name, aliases)
            if kind is None and (mk := _module_kind(name)) is not None and "." in name:
                kind = mk
            if kind is None and isinstance(node.func, ast.Attribute) and node.func.attr in DELETING_METHODS:
                kind = "file deletion"
            if kind is None and name in ("torch.load",) and any(
                    k.arg == "weights_only" and isinstance(k.value, ast.Constant) and k.value.value is False
                    for k in node.keywords):
                kind = "unsafe deserialization"
            if kind is None and name in ("setattr", "delattr") and node.args and \
                    _dotted(node.args[0], aliases).startswith("torch.distributed"):
                kind = "monkeypatching torch.distributed"
            if kind is not None:
                out.append(Danger(kind, f"{name}()", node.lineno))
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for t in targets:
                name = _dotted(t, aliases)
                if isinstance(t, ast.Attribute) and (name.startswith("torch.distributed.") or
                                                     name.startswith("torch.nn.parallel.")):
                    out.append(Danger("monkeypatching torch.distributed", f"{name} = ...", node.lineno))
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(
                    node.value.value, str) and len(node.value.value) >= 8 and any(
                    SECRET_NAMES.search(_dotted(t, {}) or "") for t in node.targets):
                out.append(Danger("a secret", f"{_dotted(node.targets[0], {})} = '...'", node.lineno))
        elif isinstance(node, ast.Name) and node.id == "__builtins__" or isinstance(
                node, ast.Attribute) and node.attr in DUNDER_ESCAPES:
            out.append(Danger("reaching into the builtins", "__builtins__" if isinstance(node, ast.Name)
                              else f".{node.attr}", node.lineno))
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Call) and _dotted(
                node.value.func, {}) in ("vars", "globals", "locals"):
            out.append(Danger("reaching into the builtins", f"{_dotted(node.value.func, {})}()[...]", node.lineno))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and SECRET.search(node.value):
            out.append(Danger("a secret", "a token-like string literal", node.lineno))
    return out


def added(before: str, after: str) -> list[Danger]:
    """The dangers in `after` beyond those already in `before` (a draft may keep what was there)."""
    try:
        old = Counter((d.kind, d.what) for d in scan(ast.parse(before)))
    except SyntaxError:
        old = Counter()
    new = scan(ast.parse(after))
    out = []
    for d in new:
        key = (d.kind, d.what)
        if old[key] > 0:
            old[key] -= 1
        else:
            out.append(d)
    return out
