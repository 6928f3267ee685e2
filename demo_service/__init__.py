"""A ResNet-class image classifier served behind AdaptiveGate: `python -m demo_service`."""

from .app import Settings, create_app

__all__ = ["Settings", "create_app"]
