"""is_oom: every framework's out-of-memory, through chains and groups, and nothing else."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from adaptive_gate import is_oom
from adaptive_gate.oom import tried_bytes


def named(name: str, base: type[BaseException] = RuntimeError) -> type[BaseException]:
    return type(name, (base,), {})


@pytest.mark.parametrize(
    "exc",
    [
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB"),
        torch.cuda.OutOfMemoryError("anything"),
        RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported"),
        named("AcceleratorError")("CUDA error: out of memory"),
        named("OutOfMemoryError", MemoryError)("Out of memory allocating 1,024 bytes (allocated so far: 0 bytes)"),
        named("XlaRuntimeError")("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.00GiB."),
        named("RuntimeException")(
            "[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Failed to allocate memory for requested buffer of size 4"
        ),
        RuntimeError("CUDA failure 2: out of memory ; GPU=0 ; expr=cudaMalloc; cudaErrorMemoryAllocation"),
        RuntimeError("HIP out of memory. Tried to allocate 2.00 GiB"),
        # TensorRT's logged lines, raised by the app (TensorRT itself only logs)
        RuntimeError(
            "[TRT] [E] 2: [executionContext.cpp::nvinfer1::rt::ExecutionContext::ExecutionContext::470] "
            "Error Code 2: OutOfMemory (no further information)"
        ),
        RuntimeError("[defaultAllocator.cpp::allocate::19] Error Code 1: Cuda Runtime (out of memory)"),
        RuntimeError("../rtSafe/safeRuntime.cpp (25) - Cuda Error in allocate: 2 (out of memory)"),
        RuntimeError(
            "Requested amount of GPU memory (17920000000 bytes) could not be allocated. There may not be enough "
            "free memory for allocation to succeed."
        ),
    ],
)
def test_recognises_framework_ooms(exc: BaseException) -> None:
    assert is_oom(exc)


@pytest.mark.parametrize(
    "exc",
    [
        MemoryError(),  # host memory: not the GPU's business
        RuntimeError("Expected all tensors to be on the same device"),
        RuntimeError("[TRT] [E] 3: [network.cpp::addInput::1507] Error Code 3: API Usage Error"),  # not memory
        ValueError("out of range"),
        KeyError("memory"),
    ],
)
def test_rejects_other_errors(exc: BaseException) -> None:
    assert not is_oom(exc)


def test_looks_through_cause_context_and_groups() -> None:
    try:
        try:
            raise torch.OutOfMemoryError("CUDA out of memory")
        except RuntimeError as inner:
            raise RuntimeError("Caught handled exception, but response already started.") from inner
    except RuntimeError as outer:
        assert is_oom(outer)
    try:
        try:
            raise RuntimeError("CUDA error: out of memory")
        except RuntimeError:
            raise ValueError("while handling") from None  # context kept, cause suppressed
    except ValueError as suppressed:
        assert is_oom(suppressed)
    group = BaseExceptionGroup("tg", [ValueError("x"), ExceptionGroup("inner", [torch.OutOfMemoryError("oom")])])
    assert is_oom(group)
    assert not is_oom(ExceptionGroup("tg", [ValueError("x")]))


def test_survives_cycles_and_broken_str() -> None:
    a, b = RuntimeError("a"), RuntimeError("b")
    a.__context__, b.__context__ = b, a
    assert not is_oom(a)

    class Broken(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    assert not is_oom(Broken())


def test_keeps_no_reference_to_the_exception() -> None:
    exc = torch.OutOfMemoryError("CUDA out of memory")
    ref = weakref.ref(exc)
    assert is_oom(exc)
    del exc
    gc.collect()
    assert ref() is None


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 23.64 GiB", 20 * 2**30),
        ("CUDA out of memory. Tried to allocate 3072.00 MiB (simulated)", 3 * 2**30),
        ("HIP out of memory. Tried to allocate 512 KiB", 512 * 2**10),
        ("CUDA error: out of memory", None),  # the runtime names no allocation
    ],
)
def test_the_allocation_an_oom_names_is_read_in_bytes(message: str, expected: int | None) -> None:
    assert tried_bytes(RuntimeError(message)) == expected


def test_the_allocation_is_found_through_the_chain() -> None:
    try:
        try:
            raise RuntimeError("CUDA out of memory. Tried to allocate 1.50 GiB")
        except RuntimeError as inner:
            raise ValueError("inference failed") from inner
    except ValueError as outer:
        assert tried_bytes(outer) == int(1.5 * 2**30)
