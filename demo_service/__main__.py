"""`python -m demo_service`: the demo on uvicorn, on CUDA where there is one, else CPU + a simulated card."""

from __future__ import annotations

import argparse
import logging
import os
import re
from pathlib import Path

import uvicorn

from adaptive_gate.options import GateOptions

from .app import Settings, create_app
from .model import DEFAULT_MODEL, MODEL_NAMES

SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMG]i?B?|B)?\s*$", re.IGNORECASE)
UNITS = {"": 1, "B": 1, "K": 2**10, "M": 2**20, "G": 2**30}
TOKEN_VARIABLE = "ADAPTIVE_GATE_ADMIN_TOKEN"


def parse_size(text: str) -> int:
    """'768MiB', '2GiB', '1.5G', '805306368' -> bytes."""
    match = SIZE.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (try 768MiB or 2GiB)")
    number, unit = match.groups()
    return int(float(number) * UNITS[(unit or "").upper()[:1]])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m demo_service",
        description=__doc__,
        epilog=f"Set {TOKEN_VARIABLE} to protect /gate/status, /gate/metrics and /gate/dashboard with that bearer "
        "token and to open PUT /gate/limits.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda[:N] (default: auto)")
    parser.add_argument("--model", default=DEFAULT_MODEL, choices=MODEL_NAMES,
                        help=f"{DEFAULT_MODEL} (default: pretrained on ImageNet) or a ResNet (random weights "
                        "unless --weights; resnet50 does about ten times the work)")  # fmt: skip
    parser.add_argument("--weights", type=Path,
                        help="a state dict to load instead (torch.load(weights_only=True))")  # fmt: skip
    parser.add_argument("--labels", type=Path,
                        help="a text file, one label per line (default: ImageNet's names for Lite0)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0, help="seed of a ResNet's random weights")
    parser.add_argument("--simulated-vram", type=parse_size, default=Settings.simulated_vram_bytes,
                        help="size of the simulated card without a GPU (default: 768MiB)")  # fmt: skip
    parser.add_argument("--vram-fraction", type=float, help="on CUDA, cap PyTorch at this fraction of the card")
    parser.add_argument("--image-side", type=int, default=224, help="inputs are resized to this square side")
    parser.add_argument("--policy", default="adaptive", help="adaptive (default), static:N or none (benchmarks)")
    parser.add_argument("--batching", default="auto", choices=["auto", "on", "off"],
                        help="/predict through adaptive_gate.batch (auto: on for CUDA, off on CPU)")  # fmt: skip
    gate = parser.add_argument_group("gate options")
    gate.add_argument("--min-limit", type=int)
    gate.add_argument("--max-limit", type=int)
    gate.add_argument("--initial-limit", type=int)
    gate.add_argument("--max-queue", type=int)
    gate.add_argument("--queue-timeout", type=float)
    gate.add_argument("--reject-status", type=int, choices=[503, 429])
    return parser.parse_args(argv)


def settings_from(args: argparse.Namespace) -> Settings:
    if not 32 <= args.image_side <= 4096:
        raise SystemExit(f"--image-side must be within [32, 4096], got {args.image_side}")
    names = ("min_limit", "max_limit", "initial_limit", "max_queue", "queue_timeout", "reject_status")
    gate = {name: getattr(args, name) for name in names if getattr(args, name) is not None}
    # A secret stays out of the command line, where `ps` would show it.
    token = os.environ.get(TOKEN_VARIABLE)
    if token:
        gate["admin_token"] = token
    try:
        if args.policy == "adaptive":  # the other policies build no gate
            GateOptions(**gate)  # said now: under uvicorn, an error building the app's middleware answers 500
    except (TypeError, ValueError) as error:
        name = TOKEN_VARIABLE if "admin_token" in str(error) else "a gate option"
        raise SystemExit(f"{name}: {error}") from None
    return Settings(
        device=args.device,
        architecture=args.model,
        weights=args.weights,
        labels=args.labels,
        seed=args.seed,
        simulated_vram_bytes=args.simulated_vram,
        vram_fraction=args.vram_fraction,
        policy=args.policy,
        batching=args.batching,
        image_side=args.image_side,
        gate=gate,
    )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s:     %(message)s")
    app = create_app(settings_from(args))
    uvicorn.run(app, host=args.host, port=args.port, log_level="info")


if __name__ == "__main__":
    main()
