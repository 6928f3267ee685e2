"""An app for `uvicorn tests.worker_app:app --workers 2` (tests/test_workers.py)."""

from fastapi import FastAPI

from adaptive_gate import AdaptiveGate

app = FastAPI()
app.add_middleware(AdaptiveGate, probe=None)
