"""The demo's CUDA set-up, on a CPU machine: the device index, the memory cap, the allocator setting."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch.cuda._utils import _get_device_index

from demo_service.app import Settings, create_app, cuda_index

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> list[tuple[float, int]]:
    """A CUDA that is there, whose current device is 2, and whose memory cap is recorded.

    The cap is checked as torch checks it (`_get_device_index(..., optional=False)`): a device
    without an index fails here exactly as it failed on the card.
    """
    calls: list[tuple[float, int]] = []

    def set_fraction(fraction: float, device: object = None) -> None:
        calls.append((fraction, _get_device_index(device, optional=False)))

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", set_fraction)
    return calls


def test_cuda_index_of_a_device_with_and_without_one(fake_cuda: list[tuple[float, int]]) -> None:
    assert cuda_index(torch.device("cuda:1")) == 1
    assert cuda_index(torch.device("cuda")) == 2  # the current device
    with pytest.raises(ValueError, match="not a CUDA device"):
        cuda_index(torch.device("cpu"))


def test_plain_cuda_with_a_fraction_caps_the_current_device(fake_cuda: list[tuple[float, int]]) -> None:
    create_app(Settings(device="cuda", vram_fraction=0.25, architecture="resnet-tiny"))
    create_app(Settings(device="cuda:0", vram_fraction=0.5, architecture="resnet-tiny"))
    assert fake_cuda == [(0.25, 2), (0.5, 0)]


def test_a_bad_fraction_is_refused_before_the_card_is_touched(fake_cuda: list[tuple[float, int]]) -> None:
    with pytest.raises(ValueError, match=r"--vram-fraction must be in \(0, 1\]"):
        create_app(Settings(device="cuda", vram_fraction=1.5, architecture="resnet-tiny"))
    assert fake_cuda == []


def test_the_allocator_setting_is_in_place_before_torch_loads() -> None:
    """Set after `import torch`, it may come too late: an import hook reads it as torch is imported."""
    code = textwrap.dedent(
        """
        import os, sys
        seen = []
        class Watch:
            def find_spec(self, name, path=None, target=None):
                if name == "torch" and not seen:
                    seen.append(os.environ.get("PYTORCH_CUDA_ALLOC_CONF"))
                return None
        sys.meta_path.insert(0, Watch())
        import demo_service
        print(seen)
        """
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['expandable_segments:True']"
    env["PYTORCH_CUDA_ALLOC_CONF"] = "max_split_size_mb:64"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['max_split_size_mb:64']"  # the user's own setting wins
