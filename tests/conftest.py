from __future__ import annotations

from typing import Any

import pytest

from adaptive_gate import AdaptiveGate


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def find_gate(app: Any) -> AdaptiveGate:
    """The gate inside a Starlette/FastAPI app's middleware stack (built at its first call)."""
    node = getattr(app, "middleware_stack", None) or app
    while node is not None:
        if isinstance(node, AdaptiveGate):
            return node
        node = getattr(node, "app", None)
    raise LookupError("no AdaptiveGate in this app's middleware stack (has it been called yet?)")
