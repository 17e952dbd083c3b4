"""Classify a function execution by name: one place, shared by live collection and trace ingestion.

Patterns are deliberately broad so that renames survive (NCCL's `ncclKernel_*` became
`ncclDevKernel_*`; RCCL uses `ncclDevKernel_Generic`; gloo and c10d name ops differently).
Unknown names are kept as compute, never dropped.
"""

from __future__ import annotations

import functools
import re

from eroica.schema.patterns import Category

_COMM = re.compile(
    r"(?i)(nccl|rccl|gloo|c10d::|record_param_comms|all_?reduce|all_?gather|reduce_?scatter|"
    r"all_?to_?all|broadcast|barrier|sendrecv|\bsend\b|\brecv\b)"
)
_MEMORY = re.compile(r"(?i)(memcpy|memset|Memcpy|Memset|cudaMemcpy|hipMemcpy)")
_DATA = re.compile(r"(enumerate\(DataLoader\)|DataLoader|_MultiProcessingDataLoaderIter|dataloader)")


@functools.lru_cache(maxsize=1 << 14)     # names repeat: a trace or a window has few distinct ones
def classify_op(name: str, on_device: bool = False) -> Category:
    """Category of an operator or kernel name."""
    if _COMM.search(name):
        return Category.communication
    if on_device:
        return Category.memory if _MEMORY.search(name) else Category.kernel
    if _DATA.search(name):
        return Category.data
    return Category.compute


@functools.lru_cache(maxsize=1 << 14)
def kernel_name(name: str) -> str:
    """A device kernel's function name without its return type, template arguments and parameter
    list (`void ns::k<float, 2>(float*, int)` -> `ns::k`): instantiations of one kernel are one function."""
    n = name.strip()
    if n.startswith("void "):
        n = n[5:]
    depth, out = 0, []
    for ch in n:
        if ch == "<":
            depth += 1
        elif ch == ">" and depth:
            depth -= 1
        elif ch == "(" and depth == 0:
            break
        elif depth == 0:
            out.append(ch)
    return "".join(out).strip() or name[:120]
