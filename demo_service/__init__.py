"""An ImageNet classifier (EfficientNet-Lite0, pretrained) served behind AdaptiveGate: `python -m demo_service`."""

from .app import Settings, create_app

__all__ = ["Settings", "create_app"]
