"""eroica's zero-code attach (`eroica run` puts this directory first on PYTHONPATH): start the
bootstrap, then run the `sitecustomize` this one shadows, if the environment has one."""

import sys

try:
    import eroica.collector.boot  # noqa: F401  (attaches when EROICA_ATTACH=1; never raises)
except Exception as _exc:
    sys.stderr.write(f"eroica attach: not attached ({_exc!r}); the job runs unwatched\n")

try:
    import importlib.machinery as _m
    import os as _os

    _here = _os.path.dirname(_os.path.abspath(__file__))
    _spec = _m.PathFinder.find_spec("sitecustomize", [p for p in sys.path if _os.path.abspath(p or ".") != _here])
    if _spec is not None and _spec.loader is not None and _spec.origin != __file__:
        _mod = sys.modules[__name__]
        _spec.loader.exec_module(_mod)          # the shadowed one, in this module's namespace
except Exception as _exc:
    sys.stderr.write(f"eroica attach: the environment's own sitecustomize failed ({_exc!r})\n")
