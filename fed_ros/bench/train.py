"""`fed-ros bench train`: local-training throughput, BC-only vs full FedDRMan losses.

For the image and the low-dim policy it times optimiser steps of plain behaviour cloning
and of FedDRMan (teacher forward + per-modality rank-r subspace loss + action distillation)
on the same synthetic batches, and prints steps/s side by side with their ratio (target:
a FedDRMan step costs <= 1.5x a BC step), the parameter count and peak memory. It also
splits the extra cost into the teacher forward and the subspace projectors.
"""
from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np
import torch

from fed_ros.learning.configuration_policy import PolicyConfig
from fed_ros.learning.dataset import DemoDataset, synthetic_episodes
from fed_ros.learning.device import peak_memory_bytes, resolve_device
from fed_ros.learning.losses import subspace_losses
from fed_ros.learning.trainer import LocalTrainer, TrainerConfig, initial_state_dict

TARGET_RATIO = 1.5


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_steps(trainer: LocalTrainer, data: DemoDataset, batches: list[np.ndarray],
                warmup: int) -> tuple[float, float]:
    """(wall, process CPU) seconds per optimiser step: medians over the timed batches.

    CPU time is what the step costs this process, whatever else shares the cores; on a
    busy machine it is the reliable basis for the BC/FedDRMan ratio.
    """
    for idx in batches[:warmup]:
        trainer.train_step(data, idx)
    wall, cpu = [], []
    for idx in batches[warmup:]:
        _sync(trainer.device)
        t0, c0 = time.perf_counter(), time.process_time()
        trainer.train_step(data, idx)
        _sync(trainer.device)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return float(np.median(wall)), float(np.median(cpu))


def _time_parts(trainer: LocalTrainer, data: DemoDataset, idx: np.ndarray, repeats: int
                ) -> dict[str, float]:
    """Milliseconds of the teacher forward and of all modality subspace losses (fwd+bwd)."""
    batch = trainer._process_batch(data, idx)
    out_s, out_t = trainer._forward(batch)
    assert out_t is not None
    _sync(trainer.device)
    t0 = time.perf_counter()
    for _ in range(repeats):
        trainer._forward(batch)
    _sync(trainer.device)
    fwd_both = (time.perf_counter() - t0) / repeats
    t0 = time.perf_counter()
    for _ in range(repeats):
        e = trainer.pc.embed_dim
        fk = torch.stack([f.detach().reshape(-1, e) for f in out_s.features.values()])
        fg = torch.stack([f.detach().reshape(-1, e) for f in out_t.features.values()])
        fk.requires_grad_(True)
        subspace_losses(fg, fk, rank=trainer.tc.rank, noise_std=trainer.tc.sub_noise_std,
                        generator=trainer.noise_gen).sum().backward()
    _sync(trainer.device)
    sub = (time.perf_counter() - t0) / repeats
    return {"fwd_student_plus_teacher_ms": 1e3 * fwd_both, "sub_losses_ms": 1e3 * sub}


def bench_kind(kind: str, device: torch.device, batch_size: int, steps: int, warmup: int,
               seed: int = 0) -> dict[str, Any]:
    """Measure one policy variant; returns the numbers printed in the table."""
    cfg = PolicyConfig(kind=kind)
    episodes = synthetic_episodes(4, max(40, batch_size), kind, seed=seed,
                                  image_size=cfg.image_size)
    data = DemoDataset(episodes, cfg)
    start = initial_state_dict(cfg, seed=seed, episodes=episodes)
    rng = np.random.default_rng(seed)
    batches = [rng.choice(len(data), batch_size, replace=False) for _ in range(warmup + steps)]
    row: dict[str, Any] = {"policy": kind, "params": int(sum(v.size for v in start.values())),
                           "batch": batch_size, "window": cfg.window, "device": str(device)}
    for mode, switches in (("bc", dict(use_sub=False, use_act=False)),
                           ("feddrman", dict(use_sub=True, use_act=True))):
        tc = TrainerConfig(device=str(device), progress=False, batch_size=batch_size, seed=seed,
                           **switches)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        trainer = LocalTrainer(start, cfg, tc)
        wall, cpu = _time_steps(trainer, data, batches, warmup)
        row[f"{mode}_steps_per_s"] = 1.0 / wall
        row[f"{mode}_cpu_s_per_step"] = cpu
        row[f"{mode}_peak_mem_mb"] = peak_memory_bytes(device) / 2**20
        if mode == "feddrman":
            row.update(_time_parts(trainer, data, batches[0], repeats=max(1, steps // 2)))
        del trainer
    row["wall_ratio"] = row["bc_steps_per_s"] / row["feddrman_steps_per_s"]
    # On CUDA the wall clock is the cost; on CPU the process CPU time is (see _time_steps).
    row["ratio"] = (row["wall_ratio"] if device.type == "cuda"
                    else row["feddrman_cpu_s_per_step"] / row["bc_cpu_s_per_step"])
    return row


def _print_table(rows: list[dict[str, Any]]) -> None:
    head = (f"{'policy':<7} {'params':>9} {'B':>3} {'T':>2}  {'BC steps/s':>10} "
            f"{'FedDRMan steps/s':>16} {'wall x':>6}  {'BC cpu-s':>8} {'FDM cpu-s':>9} "
            f"{'ratio':>5} (<= {TARGET_RATIO})  {'fwd S+T ms':>10} {'L_sub ms':>8}  "
            f"{'peak MB BC/FDM':>15}")
    print(head)
    print("-" * len(head))
    for r in rows:
        ok = "ok" if r["ratio"] <= TARGET_RATIO else "OVER"
        print(f"{r['policy']:<7} {r['params']:>9,} {r['batch']:>3} {r['window']:>2}  "
              f"{r['bc_steps_per_s']:>10.2f} {r['feddrman_steps_per_s']:>16.2f} "
              f"{r['wall_ratio']:>6.2f}  {r['bc_cpu_s_per_step']:>8.3f} "
              f"{r['feddrman_cpu_s_per_step']:>9.3f} {r['ratio']:>5.2f} {ok:<9}  "
              f"{r['fwd_student_plus_teacher_ms']:>10.1f} {r['sub_losses_ms']:>8.1f}  "
              f"{r['bc_peak_mem_mb']:>7.0f}/{r['feddrman_peak_mem_mb']:<7.0f}")


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the table; returns 0."""
    ap = argparse.ArgumentParser(prog="fed-ros bench train", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="few steps, batch 8 (smoke run)")
    ap.add_argument("--kinds", default="lowdim,image", help="comma list of image,lowdim")
    ap.add_argument("--batch", type=int, default=32, help="batch size (paper: 32)")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per mode")
    ap.add_argument("--warmup", type=int, default=2, help="untimed warm-up steps")
    ap.add_argument("--device", default="auto", help="auto, cpu or cuda[:i]")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    ap.add_argument("--json", help="also write the rows to this JSON file")
    args = ap.parse_args(argv)
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    for k in kinds:
        if k not in ("image", "lowdim"):
            ap.error(f"unknown policy kind {k!r}")
    if args.quick:
        args.batch, args.steps, args.warmup = min(args.batch, 8), min(args.steps, 3), 1
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    print(f"fed-ros bench train: device={device} threads={torch.get_num_threads()} "
          f"batch={args.batch} steps={args.steps} (median step time)")
    rows = [bench_kind(k, device, args.batch, args.steps, args.warmup) for k in kinds]
    _print_table(rows)
    print("ratio = FedDRMan/BC step cost: wall clock on CUDA, process CPU time on CPU (robust "
          "to other load; 'wall x' is the wall-clock ratio). cpu-s: CPU seconds per step.")
    print("peak memory: CUDA allocator peak per mode on GPU; process max RSS on CPU "
          "(cumulative, so the FedDRMan column includes the BC run)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
