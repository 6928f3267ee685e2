"""Public import path of the status: the document lives in `_observe/status.py`, the figures it
renders in `_gate/figures.py`."""

from ._gate.figures import BucketCounts as BucketCounts
from ._gate.figures import Counters as Counters
from ._gate.figures import RecentValues as RecentValues
from ._gate.figures import percentiles_ms as percentiles_ms
from ._observe.status import render_json as render_json
from ._observe.status import status_document as status_document

__all__ = ["BucketCounts", "Counters", "RecentValues", "percentiles_ms", "render_json", "status_document"]
