"""Recognising out-of-memory errors from GPU frameworks without importing any of them.

Frameworks disagree on how an OOM looks: PyTorch raises `torch.OutOfMemoryError` (a
`RuntimeError`) from its allocator and `torch.AcceleratorError("CUDA error: out of memory")` from
the runtime; CuPy has its own `OutOfMemoryError`; JAX/XLA says `RESOURCE_EXHAUSTED`; ONNX Runtime
says "Failed to allocate memory"; TensorRT logs "Error Code 2: OutOfMemory" (an app that raises with
the logged line is understood). Importing them to use `isinstance` would drag gigabytes into a
service that uses one of them, so we match by class name and message instead, through
`__cause__`/`__context__` chains and exception groups (anyio task groups wrap endpoint errors).

The caller must not keep the exception: a live OOM exception pins its frames, and with them the
very GPU tensors whose memory ran out.
"""

from __future__ import annotations

import re
from collections.abc import Callable

_OOM_CLASS_NAMES = frozenset({"OutOfMemoryError", "OutOfMemory"})

_OOM_MESSAGES = (
    "cuda out of memory",  # torch allocator
    "cuda error: out of memory",  # torch/CUDA runtime
    "hip out of memory",  # torch on ROCm
    "mps backend out of memory",  # torch on Apple
    "xpu out of memory",  # torch on Intel
    "resource_exhausted",  # JAX / XLA
    "failed to allocate memory",  # ONNX Runtime
    "cudaerrormemoryallocation",  # ONNX Runtime, CUDA runtime names
    "cublas_status_alloc_failed",
    "cudnn_status_alloc_failed",
    "out of memory allocating",  # CuPy
    # TensorRT logs rather than raises (execution returns False): these reach `is_oom` in the exception an app
    # raises with the logged line, as a logger that raises on errors does
    "error code 2: outofmemory",  # "[executionContext.cpp::...] Error Code 2: OutOfMemory (no further information)"
    "cuda runtime (out of memory)",  # "[defaultAllocator.cpp::allocate::19] Error Code 1: Cuda Runtime (out of memory)"
    "cuda error in allocate: 2 (out of memory)",  # TensorRT 7 and its ONNX Runtime provider
    "requested amount of gpu memory",  # "Requested amount of GPU memory (N bytes) could not be allocated"
)

_MAX_EXCEPTIONS_VISITED = 64
# torch's allocator: "CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity ..."
_TRIED = re.compile(r"tried to allocate (\d+(?:\.\d+)?) ?(b|kib|mib|gib|tib)\b", re.IGNORECASE)
_UNIT_BYTES = {"b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def is_oom(exc: BaseException) -> bool:
    """Whether `exc`, or an exception it was raised from or groups, is a device out-of-memory."""
    return any_in_chain(exc, _looks_like_oom)


def tried_bytes(exc: BaseException) -> int | None:
    """The allocation an OOM names ("Tried to allocate 20.00 GiB", as torch's allocator says), in
    bytes; None where no exception in the chain names one. It tells an OOM that no load could have
    avoided (more than the card has beside the others) from one that too many at once caused."""
    found: list[int] = []

    def names_one(current: BaseException) -> bool:
        try:
            match = _TRIED.search(str(current))
        except Exception:  # a broken __str__ names nothing
            return False
        if match is not None:
            found.append(round(float(match.group(1)) * _UNIT_BYTES[match.group(2).lower()]))
        return match is not None

    any_in_chain(exc, names_one)
    return found[0] if found else None


def any_in_chain(exc: BaseException, predicate: Callable[[BaseException], bool]) -> bool:
    """Whether `predicate` holds for `exc` or an exception it was raised from or groups."""
    pending: list[BaseException] = [exc]
    seen: set[int] = set()
    while pending and len(seen) < _MAX_EXCEPTIONS_VISITED:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if predicate(current):
            return True
        if isinstance(current, BaseExceptionGroup):
            pending.extend(current.exceptions)
        if current.__cause__ is not None:
            pending.append(current.__cause__)
        if current.__context__ is not None:
            pending.append(current.__context__)
    return False


def _looks_like_oom(exc: BaseException) -> bool:
    if any(cls.__name__ in _OOM_CLASS_NAMES for cls in type(exc).__mro__):
        return True  # CuPy's derives from MemoryError, hence checked first
    if type(exc) is MemoryError:
        return False  # host memory: not a device event, the GPU limit must not react to it
    try:
        message = str(exc).lower()
    except Exception:  # a broken __str__ must not turn a request into a crash
        return False
    return any(marker in message for marker in _OOM_MESSAGES)
