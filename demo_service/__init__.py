"""A ResNet-class image classifier served behind AdaptiveGate: `python -m demo_service`."""

import os

# PyTorch reads its allocator setting once, when it sets CUDA up (newer releases as torch loads), so it
# is set here, before anything in the package imports torch: fewer fragments under varied input sizes.
# The user's own setting wins.
if "PYTORCH_CUDA_ALLOC_CONF" not in os.environ and "PYTORCH_ALLOC_CONF" not in os.environ:
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"

from .app import Settings, create_app  # noqa: E402

__all__ = ["Settings", "create_app"]
