"""A ResNet-class image classifier in plain PyTorch: no torchvision, nothing downloaded.

Weights are seeded random by default (the point is real tensor work with real memory use, not
useful labels), or a state dict from a path the user gives. `activation_bytes` measures, once per
input shape, the bytes a forward pass of that shape produces, with forward hooks: the number the
simulated card charges each request.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

ARCHITECTURES: dict[str, tuple[str, Sequence[int], int]] = {
    # name: (block, blocks per stage, base width)
    "resnet50": ("bottleneck", (3, 4, 6, 3), 64),
    "resnet18": ("basic", (2, 2, 2, 2), 64),
    "resnet-tiny": ("basic", (1, 1, 1, 1), 16),  # for tests: the same code path, a fraction of the work
}


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, in_channels: int, width: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, width, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut = _shortcut(in_channels, width, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, in_channels: int, width: int, stride: int) -> None:
        super().__init__()
        out_channels = width * self.expansion
        self.conv1 = nn.Conv2d(in_channels, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_channels, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut = _shortcut(in_channels, out_channels, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + self.shortcut(x))


def _shortcut(in_channels: int, out_channels: int, stride: int) -> nn.Module:
    if stride == 1 and in_channels == out_channels:
        return nn.Identity()
    return nn.Sequential(nn.Conv2d(in_channels, out_channels, 1, stride, bias=False), nn.BatchNorm2d(out_channels))


class ResNet(nn.Module):
    def __init__(self, architecture: str = "resnet50", num_classes: int = 1000) -> None:
        super().__init__()
        if architecture not in ARCHITECTURES:
            raise ValueError(f"unknown architecture {architecture!r}; choose one of {sorted(ARCHITECTURES)}")
        block_name, depths, base = ARCHITECTURES[architecture]
        block: type[BasicBlock] | type[Bottleneck] = Bottleneck if block_name == "bottleneck" else BasicBlock
        self.stem = nn.Sequential(
            nn.Conv2d(3, base, 7, 2, 3, bias=False),
            nn.BatchNorm2d(base),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, 2, 1),
        )
        stages: list[nn.Module] = []
        in_channels = base
        for index, depth in enumerate(depths):
            width = base * 2**index
            for position in range(depth):
                stride = 2 if index > 0 and position == 0 else 1
                stages.append(block(in_channels, width, stride))
                in_channels = width * block.expansion
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(in_channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.pool(self.stages(self.stem(x))), 1))


def build_model(architecture: str, *, num_classes: int, seed: int, weights: Path | None) -> ResNet:
    torch.manual_seed(seed)
    model = ResNet(architecture, num_classes)
    if weights is not None:
        state = torch.load(weights, map_location="cpu", weights_only=True)
        model.load_state_dict(state)
    return model.eval()


def weight_bytes(model: nn.Module) -> int:
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


def activation_bytes(model: nn.Module, shape: tuple[int, ...], device: torch.device) -> int:
    """Bytes of every leaf module's output for one forward pass of an input of `shape`."""
    total = 0

    def count(_: nn.Module, __: object, output: object) -> None:
        nonlocal total
        if isinstance(output, torch.Tensor):
            total += output.numel() * output.element_size()

    leaves = [m for m in model.modules() if not list(m.children())]
    handles = [m.register_forward_hook(count) for m in leaves]
    try:
        with torch.inference_mode():
            model(torch.zeros(shape, device=device))
    finally:
        for handle in handles:
            handle.remove()
    return total + int(torch.Size(shape).numel()) * 4
