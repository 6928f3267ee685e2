"""The model's life in the process: loaded once, warmed up, and run on decoded images.

Images are decoded defensively (a client's bytes are hostile until shown otherwise: see
`decode_image`), resized whole to the model's square input with a bicubic filter, and normalised
as the model's weights expect (`model.Preprocessing`).

On CUDA the card is real and PyTorch raises its own out-of-memory errors. Without a GPU the model
computes on the CPU for real, and its memory is accounted on a `SimulatedGPU`: the weights' bytes
from the start, and for each request its input's bytes, then each layer's output as the layer
produces it (`_Activations`), all held until the forward pass ends. So a request that does not
fit runs out of memory part-way through its forward pass, after the work of the layers before,
as CUDA's allocator fails when an activation is allocated; charging the whole input shape up
front would fail before any compute, and make an OOM free for whoever causes it (a policy that
admits everyone would lose nothing on the demo that it loses on a card). Every policy runs the
same `predict`, so the charge is the same for all.
"""

from __future__ import annotations

import io
import logging
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image, UnidentifiedImageError

from adaptive_gate.testing import Allocation, SimulatedGPU

from .model import Preprocessing, activation_bytes, build_model, leaf_modules, preprocessing_for, weight_bytes

logger = logging.getLogger("demo_service")

IMAGE_SIDE = 224
ACCEPTED_FORMATS = {"PNG", "JPEG"}
# What Pillow raises on a malformed header or metadata chunk (a zTXt or iCCP that inflates past its
# 1 MiB cap raises ValueError): the client's fault, a 400, never a 500.
MALFORMED = (OSError, SyntaxError, ValueError, EOFError, struct.error)


class BadImage(ValueError):
    """The client sent something we cannot classify; `status` says which 4xx it deserves."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


@dataclass(frozen=True)
class Prediction:
    label: str
    score: float


def decode_image(data: bytes, *, max_pixels: int, side: int = IMAGE_SIDE) -> torch.Tensor:
    """PNG or JPEG bytes -> a 3 x side x side float tensor of pixels in [0, 1], or BadImage.

    The whole image is resized to the square input (bicubic, aspect not kept), not centre-cropped
    as in TensorFlow's evaluation: a portrait loses what makes it one under an 87.5% crop (the
    README's photo goes from "military uniform" at 0.46 to "academic gown" at 0.24).

    The pixel count is checked from the header, before any pixel is decoded, so a small file that
    claims 30000x30000 costs nothing. Pillow's own decompression-bomb guard fires earlier, inside
    `Image.open`, for the largest claims; it is caught here as the same 413.
    """
    image = _open(data)
    if image.format not in ACCEPTED_FORMATS:
        raise BadImage(415, f"{image.format} images are not accepted; send PNG or JPEG")
    width, height = image.size
    if width * height > max_pixels:
        raise BadImage(413, f"the image has {width}x{height} pixels, more than the limit of {max_pixels}")
    try:
        image.load()
        rgb = image.convert("RGB")
    except MALFORMED as exc:
        raise BadImage(400, f"the image is truncated or corrupt: {exc}") from exc
    rgb = rgb.resize((side, side), Image.Resampling.BICUBIC)
    pixels = torch.frombuffer(bytearray(rgb.tobytes()), dtype=torch.uint8).view(side, side, 3)
    return pixels.permute(2, 0, 1).float().div_(255)


def _open(data: bytes) -> Image.Image:
    """Read the header and the chunks before the pixels; every way that fails is the client's 4xx."""
    try:
        return Image.open(io.BytesIO(data))
    # Between Pillow's two thresholds it only warns, and our own limit, lower, answers below; where
    # warnings are errors (the tests) the warning arrives here, and means the same.
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise BadImage(413, f"the image claims more pixels than any accepted image: {exc}") from exc
    except UnidentifiedImageError as exc:
        raise BadImage(400, "the file is not an image (PNG or JPEG expected)") from exc
    except MALFORMED as exc:
        raise BadImage(400, f"the image's header or metadata is malformed or too large: {exc}") from exc


class _Activations:
    """Charges a forward pass's activations to the simulated card as its layers produce them.

    A forward hook on every leaf module (the ones `model.activation_bytes` counts) allocates that
    layer's output on the card, so the pass's charge grows through the pass and reaches the shape's
    `activation_bytes` at its end; an allocation that does not fit raises the card's OOM from the
    hook, out of `model(...)`, after the layers before it have computed. The model is shared by the
    worker threads, so each thread charges its own pass (a thread-local list); a forward pass
    outside `charged` (warm-up, the measurement) charges nothing.
    """

    def __init__(self, model: torch.nn.Module, gpu: SimulatedGPU) -> None:
        self.gpu = gpu
        self._local = threading.local()
        for leaf in leaf_modules(model):
            leaf.register_forward_hook(self._charge_output)

    @contextmanager
    def charged(self, input_bytes: int) -> Iterator[None]:
        """Hold `input_bytes` (the input on the card), then each layer's output; free all at the end."""
        held: list[Allocation] = []
        self._local.held = held
        try:
            self._take(held, input_bytes)
            yield
        finally:
            self._local.held = None
            for allocation in reversed(held):
                allocation.release()

    def _charge_output(self, _: torch.nn.Module, __: object, output: object) -> None:
        held: list[Allocation] | None = getattr(self._local, "held", None)
        if held is not None and isinstance(output, torch.Tensor):
            self._take(held, output.numel() * output.element_size())

    def _take(self, held: list[Allocation], nbytes: int) -> None:
        allocation = self.gpu.allocate(nbytes)
        allocation.__enter__()  # raises the card's OOM when it does not fit
        held.append(allocation)


class Classifier:
    """One model per process, on one device, with the simulated card where there is no GPU."""

    def __init__(
        self,
        model: torch.nn.Module,
        labels: list[str],
        device: torch.device,
        gpu: SimulatedGPU | None,
        side: int,
        preprocessing: Preprocessing,
    ) -> None:
        self.model = model
        self.side = side
        self.mean = torch.tensor(preprocessing.mean).view(1, 3, 1, 1)
        self.std = torch.tensor(preprocessing.std).view(1, 3, 1, 1)
        self.labels = labels
        self.device = device
        self.gpu = gpu
        self._activation_bytes: dict[tuple[int, ...], int] = {}
        self._measure_lock = threading.Lock()
        self._activations = None if gpu is None else _Activations(model, gpu)

    def bytes_for(self, shape: tuple[int, ...]) -> int:
        """Activation bytes of an input shape, measured once per shape."""
        with self._measure_lock:
            if shape not in self._activation_bytes:
                self._activation_bytes[shape] = activation_bytes(self.model, shape, self.device)
            return self._activation_bytes[shape]

    @contextmanager
    def _memory(self, batch: torch.Tensor) -> Iterator[None]:
        """On the simulated card, the forward pass's memory, taken as it runs (`_Activations`)."""
        if self._activations is None:
            yield
            return
        with self._activations.charged(batch.numel() * 4):  # float32 input, as `activation_bytes` counts it
            yield

    def predict(self, images: list[torch.Tensor]) -> tuple[list[list[Prediction]], float]:
        """Top-5 per image of [0, 1] pixels (`decode_image`), normalised here as the weights expect."""
        batch = (torch.stack(images) - self.mean) / self.std
        started = time.perf_counter()
        with self._memory(batch), torch.inference_mode():
            logits = self.model(batch.to(self.device))
            probabilities = torch.softmax(logits.float(), dim=1).cpu()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        elapsed_ms = (time.perf_counter() - started) * 1000
        top = torch.topk(probabilities, k=min(5, len(self.labels)), dim=1)
        results = [
            [Prediction(self.labels[int(i)], round(float(s), 6)) for s, i in zip(scores, indices, strict=True)]
            for scores, indices in zip(top.values, top.indices, strict=True)
        ]
        return results, elapsed_ms

    def warm_up(self) -> None:
        """A first forward pass initialises kernels and the allocator before the service says it is ready."""
        shape = (1, 3, self.side, self.side)
        self.bytes_for(shape)
        with torch.inference_mode():
            self.model(torch.zeros(shape, device=self.device))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


_loaded: dict[tuple[object, ...], Classifier] = {}
_load_lock = threading.Lock()


def load_classifier(
    *,
    architecture: str,
    device: torch.device,
    weights: Path | None,
    labels: list[str],
    seed: int,
    gpu: SimulatedGPU | None,
    side: int = IMAGE_SIDE,
) -> Classifier:
    """Load the model once per process: a second start-up (a second lifespan) reuses it.

    On a simulated card the weights are allocated on it for good, as they would be on a real one.
    """
    key = (architecture, str(device), str(weights), tuple(labels), seed, id(gpu), side)
    with _load_lock:
        if key in _loaded:
            logger.warning("demo_service: model already loaded in this process; reusing it instead of loading twice")
            return _loaded[key]
        model = build_model(architecture, num_classes=len(labels), seed=seed, weights=weights).to(device)
        if gpu is not None:
            needed = weight_bytes(model)
            if needed >= gpu.total_bytes:
                raise ValueError(
                    f"--simulated-vram of {gpu.total_bytes} bytes cannot even hold the weights ({needed} bytes)"
                )
            gpu.allocate(needed).__enter__()  # held for the life of the process, like loaded weights
        classifier = Classifier(model, labels, device, gpu, side, preprocessing_for(architecture))
        classifier.warm_up()
        _loaded[key] = classifier
        return classifier
