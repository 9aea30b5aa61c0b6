"""`fed-ros bench train data-path`: windows per second of the image policy's data path, with the
demonstrations on the host (numpy batches copied to the device) and on the device
(`fed_ros.learning.device_dataset`), side by side, for the batch building with its random-shift
augmentation alone and for whole training steps (issue 23 item 5).

On a GPU the host path bounded the step rate (an H200 trained the `lite` policy at 14.1 steps/s
at batch 512, about 7,000 windows/s, the GPU almost idle); the ratio column says what keeping
the frames on the device buys. On a CPU both paths do the same work on the same processor.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def data_path_rows(
    device: torch.device,
    batches: tuple[int, ...] = (32, 512),
    steps: int = 10,
    episodes: int = 40,
    image_profile: str = "lite",
) -> list[dict[str, Any]]:
    """Per batch size and path (host, device): windows/s building batches (+ augmentation) and
    windows/s of whole FedDRMan training steps."""
    from fed_ros.learning.configuration_policy import PolicyConfig
    from fed_ros.learning.configuration_trainer import TrainerConfig
    from fed_ros.learning.dataset import DemoDataset, synthetic_episodes
    from fed_ros.learning.device_dataset import DeviceDataset
    from fed_ros.learning.trainer import LocalTrainer, initial_state_dict

    cfg = PolicyConfig(kind="image", image_profile=image_profile)
    eps = synthetic_episodes(episodes, max(40, max(batches) // 8), "image", seed=0)
    host = DemoDataset(eps, cfg)
    on_device = DeviceDataset(host, device)
    start = initial_state_dict(cfg, seed=0, episodes=eps)
    rng = np.random.default_rng(0)
    rows = []
    for batch in batches:
        trainer = LocalTrainer(
            start, cfg, TrainerConfig(device=str(device), batch_size=batch, progress=False)
        )
        for path, data in (("host", host), ("device", on_device)):
            idx = [rng.integers(0, len(host), batch) for _ in range(steps + 2)]
            for i in idx[:2]:  # warm-up (allocator, cuDNN)
                trainer.train_step(data, i)
            _sync(device)
            t0 = time.perf_counter()
            for i in idx[2:]:
                trainer.process_batch(data, i)
            _sync(device)
            build_s = (time.perf_counter() - t0) / steps
            t0 = time.perf_counter()
            for i in idx[2:]:
                trainer.train_step(data, i)
            _sync(device)
            step_s = (time.perf_counter() - t0) / steps
            rows.append(
                {
                    "batch": batch,
                    "path": path,
                    "build_windows_per_s": batch / build_s,
                    "step_windows_per_s": batch / step_s,
                    "steps_per_s": 1.0 / step_s,
                }
            )
    return rows


def print_data_path(rows: list[dict[str, Any]], device: torch.device) -> None:
    """The table, each device row beside its host row (ratios measured in the same run)."""
    print(f"fed-ros bench train data-path: device={device}, image policy, windows/s")
    print(
        f"{'batch':>6} {'path':<7} {'build+aug':>11} {'x host':>7} {'train step':>11} {'x host':>7}"
    )
    host = {r["batch"]: r for r in rows if r["path"] == "host"}
    for r in rows:
        h = host[r["batch"]]
        print(
            f"{r['batch']:>6} {r['path']:<7} {r['build_windows_per_s']:>11.0f} "
            f"{r['build_windows_per_s'] / h['build_windows_per_s']:>7.2f} "
            f"{r['step_windows_per_s']:>11.0f} "
            f"{r['step_windows_per_s'] / h['step_windows_per_s']:>7.2f}"
        )
