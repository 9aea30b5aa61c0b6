"""Time each camera encoder per frame on the CPU: the numbers in docs/learning.md.

Usage: ``OMP_NUM_THREADS=1 python tools/time_backbones.py [--threads 1] [--size 84]``.
Random weights in each published layout (the time does not depend on the values), batches
of 32 frames (8 for DINOv2 at 224 px); prints the best of ``--repeats`` runs per frame, in
milliseconds of wall and of process CPU time.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch

from fed_ros.learning.backbones.dinov2 import DinoV2ViTS14
from fed_ros.learning.backbones.resnet import ResNet18
from fed_ros.learning.backbones.trunk import FrozenTrunk, PretrainedTrunk
from fed_ros.learning.configuration_policy import PolicyConfig
from fed_ros.learning.policy_modules import image_encoder


def best_ms(fn: Callable[[], object], frames: int, repeats: int) -> tuple[float, float]:
    """Best (wall, process CPU) time of ``fn`` over ``repeats`` runs after one warm-up, per
    frame, in ms. On a shared machine the CPU time is the steadier one: with one thread,
    waiting for a core counts in the wall time only."""
    fn()
    wall, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return 1000.0 * min(wall) / frames, 1000.0 * min(cpu) / frames


def main() -> None:
    """Print one line per encoder and mode."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--size", type=int, default=84, help="camera frame side in pixels")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    n, size = args.batch, args.size
    x = torch.rand(n, 3, size, size)
    cond = torch.randn(n, 64)

    def train_step(enc: torch.nn.Module) -> Callable[[], None]:
        def run() -> None:
            enc.zero_grad(set_to_none=True)
            enc(x, cond).sum().backward()

        return run

    def inference(enc: Callable) -> Callable[[], None]:
        def run() -> None:
            with torch.no_grad():
                enc(x, cond) if isinstance(enc, torch.nn.Module) else enc(x)

        return run

    rows = []
    for profile in ("lite", "resnet_t"):
        enc = image_encoder(PolicyConfig(kind="image", image_size=size, image_profile=profile))
        rows.append((f"scratch {profile}", "forward", best_ms(inference(enc), n, args.repeats)))
        rows.append((f"scratch {profile}", "train step", best_ms(train_step(enc), n, args.repeats)))

    with tempfile.TemporaryDirectory() as tmp:
        for name, module in (("resnet18_imagenet", ResNet18()), ("dinov2_vits14", DinoV2ViTS14())):
            path = Path(tmp) / f"{name}.pth"
            torch.save(module.state_dict(), path)
            cfg = PolicyConfig(
                kind="image", image_size=size, vision_backbone=name, backbone_weights=str(path)
            )
            label = f"{name} @{cfg.backbone_image_size}"
            trunk = FrozenTrunk(PretrainedTrunk(name, path, cfg.backbone_image_size), 0)
            rows.append((label, "frozen forward", best_ms(inference(trunk), n, args.repeats)))
            # The warm-up run fills the shared cache: the timed steps are all cache hits.
            frozen = image_encoder(cfg)
            rows.append(
                (label, "frozen, cached: step", best_ms(train_step(frozen), n, args.repeats))
            )
            tuned = image_encoder(dataclasses.replace(cfg, freeze_backbone=False))
            rows.append((label, "fine-tune step", best_ms(train_step(tuned), n, args.repeats)))
        big = FrozenTrunk(PretrainedTrunk("dinov2_vits14", path, 224), 0)
        few = x[:8]
        rows.append(("dinov2_vits14 @224", "frozen forward", best_ms(lambda: big(few), 8, 2)))
    print(f"# {args.threads} thread(s), {size}x{size} frames, batch {n}, best of {args.repeats}")
    print(f"{'encoder':28s} {'mode':22s} {'wall ms/frame':>14s} {'CPU ms/frame':>13s}")
    for encoder, mode, (wall, cpu) in rows:
        print(f"{encoder:28s} {mode:22s} {wall:14.2f} {cpu:13.2f}")


if __name__ == "__main__":
    main()
