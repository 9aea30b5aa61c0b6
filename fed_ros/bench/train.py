"""`fed-ros bench train`: local-training throughput, BC-only vs full FedDRMan losses.

For the image and the low-dim policy it times optimiser steps of plain behaviour cloning
and of FedDRMan (teacher forward + per-modality rank-r subspace loss + action distillation)
on the same synthetic batches, and prints steps/s side by side with their ratio (target:
a FedDRMan step costs <= 1.5x a BC step), the parameter count and peak memory. It also
splits the extra cost into the teacher forward and the subspace projectors.

The other modes are subcommands. ``lift`` measures that the camera policy still learns: it
collects scripted Lift demonstrations with both cameras (MuJoCo, in process), trains BC from
the images and reports closed-loop success over seeded evaluation episodes (`train_lift`);
``closed-loop`` does the same for any task and policy kind; ``data-path`` times the image data
path (`train_data_path`). The old flags ``--lift``, ``--closed-loop`` and ``--data-path``
still select them.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fed_ros.bench.train_lift import lift_from_images, policy_overrides
from fed_ros.learning.configuration_fleet_encoder import OBJECTIVES, FleetEncoderConfig
from fed_ros.learning.configuration_policy import IMAGE_PROFILES, PolicyConfig
from fed_ros.learning.dataset import DemoDataset, synthetic_episodes
from fed_ros.learning.device import peak_memory_bytes, resolve_device
from fed_ros.learning.losses import subspace_losses
from fed_ros.learning.configuration_trainer import LR_SCHEDULES, TrainerConfig
from fed_ros.learning.trainer import LocalTrainer, initial_state_dict

TARGET_RATIO = 1.5


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_interleaved(
    trainers: dict[str, LocalTrainer], data: DemoDataset, batches: list[np.ndarray]
) -> dict[str, tuple[list[float], list[float]]]:
    """Per mode, (wall, process CPU) seconds of each timed optimiser step.

    The modes take turns on every batch (and which goes first alternates), so a change of
    machine load during the run lands on both alike instead of on whichever mode ran
    second. CPU time is what the step costs this process, whatever else shares the cores.
    """
    times: dict[str, tuple[list[float], list[float]]] = {m: ([], []) for m in trainers}
    modes = list(trainers)
    for i, idx in enumerate(batches):
        for mode in modes if i % 2 == 0 else modes[::-1]:
            trainer = trainers[mode]
            _sync(trainer.device)
            t0, c0 = time.perf_counter(), time.process_time()
            trainer.train_step(data, idx)
            _sync(trainer.device)
            times[mode][0].append(time.perf_counter() - t0)
            times[mode][1].append(time.process_time() - c0)
    return times


def _time_parts(
    trainer: LocalTrainer, data: DemoDataset, idx: np.ndarray, repeats: int
) -> dict[str, float]:
    """Milliseconds of the teacher forward and of all modality subspace losses (fwd+bwd)."""
    batch = trainer.process_batch(data, idx)
    out_s, out_t = trainer.forward(batch)
    assert out_t is not None
    _sync(trainer.device)
    t0 = time.perf_counter()
    for _ in range(repeats):
        trainer.forward(batch)
    _sync(trainer.device)
    fwd_both = (time.perf_counter() - t0) / repeats
    t0 = time.perf_counter()
    for _ in range(repeats):
        e = trainer.pc.embed_dim
        fk = torch.stack([f.detach().reshape(-1, e) for f in out_s.features.values()])
        fg = torch.stack([f.detach().reshape(-1, e) for f in out_t.features.values()])
        fk.requires_grad_(True)
        subspace_losses(
            fg,
            fk,
            rank=trainer.tc.rank,
            noise_std=trainer.tc.sub_noise_std,
            generator=trainer.noise_gen,
        ).sum().backward()
    _sync(trainer.device)
    sub = (time.perf_counter() - t0) / repeats
    return {"fwd_student_plus_teacher_ms": 1e3 * fwd_both, "sub_losses_ms": 1e3 * sub}


def _distinct_frames(data: DemoDataset, batches: list[np.ndarray]) -> float:
    """Mean distinct frames per batch per camera (what the image encoders actually run on)."""
    return float(np.mean([len(np.unique(data.window_index[idx])) for idx in batches]))


def bench_kind(
    kind: str,
    device: torch.device,
    batch_size: int,
    steps: int,
    warmup: int,
    seed: int = 0,
    image_profile: str = "lite",
    amp: bool = True,
    episodes: int = 4,
) -> dict[str, Any]:
    """Measure one policy variant; returns the numbers printed in the table."""
    cfg = PolicyConfig(kind=kind, image_profile=image_profile)
    demos = synthetic_episodes(
        episodes, max(40, batch_size), kind, seed=seed, image_size=cfg.image_size
    )
    data = DemoDataset(demos, cfg)
    start = initial_state_dict(cfg, seed=seed, episodes=demos)
    rng = np.random.default_rng(seed)
    batches = [rng.choice(len(data), batch_size, replace=False) for _ in range(warmup + steps)]
    row: dict[str, Any] = {
        "policy": kind,
        "params": int(sum(v.size for v in start.values())),
        "batch": batch_size,
        "window": cfg.window,
        "device": str(device),
        "frames": len(data),
        "amp": bool(amp and device.type == "cuda"),
    }
    if kind == "image":
        row["image_profile"] = cfg.image_profile
        row["distinct_frames"] = _distinct_frames(data, batches)
    trainers: dict[str, LocalTrainer] = {}
    for mode, switches in (
        ("bc", dict(use_sub=False, use_act=False)),
        ("feddrman", dict(use_sub=True, use_act=True)),
    ):
        tc = TrainerConfig(
            device=str(device),
            progress=False,
            batch_size=batch_size,
            seed=seed,
            amp=amp,
            **switches,
        )
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        trainer = LocalTrainer(start, cfg, tc)
        for idx in batches[:warmup]:  # warm-up alone, so the peak belongs to this mode
            trainer.train_step(data, idx)
        row[f"{mode}_peak_mem_mb"] = peak_memory_bytes(device) / 2**20
        trainers[mode] = trainer
    times = _time_interleaved(trainers, data, batches[warmup:])
    for mode, (wall, cpu) in times.items():
        row[f"{mode}_steps_per_s"] = 1.0 / float(np.median(wall))
        row[f"{mode}_cpu_s_per_step"] = float(np.median(cpu))
    row.update(_time_parts(trainers["feddrman"], data, batches[0], repeats=max(1, steps // 2)))

    # Ratios of each batch's pair of steps (same batch, same moment), then their median.
    def pair(m: int) -> float:
        return float(np.median(np.asarray(times["feddrman"][m]) / np.asarray(times["bc"][m])))

    row["wall_ratio"] = pair(0)
    # On CUDA the wall clock is the cost; on CPU the process CPU time is.
    row["ratio"] = row["wall_ratio"] if device.type == "cuda" else pair(1)
    return row


def _print_table(rows: list[dict[str, Any]]) -> None:
    for r in rows:
        if r["policy"] == "image":
            print(
                f"image: profile {r['image_profile']}, {r['frames']} dataset frames, "
                f"{r['distinct_frames']:.0f} distinct of {r['batch'] * r['window']} "
                f"frames per camera per batch (each encoded once)"
            )
    head = (
        f"{'policy':<7} {'params':>9} {'B':>3} {'T':>2}  {'BC steps/s':>10} "
        f"{'FedDRMan steps/s':>16} {'wall x':>6}  {'BC cpu-s':>8} {'FDM cpu-s':>9} "
        f"{'ratio':>5} (<= {TARGET_RATIO})  {'fwd S+T ms':>10} {'L_sub ms':>8}  "
        f"{'peak MB BC/FDM':>15}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        ok = "ok" if r["ratio"] <= TARGET_RATIO else "OVER"
        print(
            f"{r['policy']:<7} {r['params']:>9,} {r['batch']:>3} {r['window']:>2}  "
            f"{r['bc_steps_per_s']:>10.2f} {r['feddrman_steps_per_s']:>16.2f} "
            f"{r['wall_ratio']:>6.2f}  {r['bc_cpu_s_per_step']:>8.3f} "
            f"{r['feddrman_cpu_s_per_step']:>9.3f} {r['ratio']:>5.2f} {ok:<9}  "
            f"{r['fwd_student_plus_teacher_ms']:>10.1f} {r['sub_losses_ms']:>8.1f}  "
            f"{r['bc_peak_mem_mb']:>7.0f}/{r['feddrman_peak_mem_mb']:<7.0f}"
        )


# The modes before they were subcommands: their old flags still select them.
LEGACY_MODE_FLAGS = {"--lift": "lift", "--closed-loop": "closed-loop", "--data-path": "data-path"}
MODES = ("steps", "lift", "closed-loop", "data-path")


def _add_device_options(ap: argparse.ArgumentParser, sub: bool) -> None:
    """Options every mode takes. On a subcommand their defaults are suppressed, so an option
    given before the subcommand is not overwritten by the subcommand's default."""
    d = (lambda v: argparse.SUPPRESS) if sub else (lambda v: v)
    ap.add_argument("--quick", action="store_true", default=d(False), help="smoke run")
    ap.add_argument("--batch", type=int, default=d(32), help="batch size (paper: 32)")
    ap.add_argument("--device", default=d("auto"), help="auto, cpu or cuda[:i]")
    ap.add_argument("--threads", type=int, default=d(0), help="torch CPU threads (0: default)")
    ap.add_argument(
        "--image-profile",
        default=d("lite"),
        choices=tuple(IMAGE_PROFILES),
        help="image trunk (lite: CPU default; resnet_t: LIBERO ResNet-T size, GPUs)",
    )
    ap.add_argument("--json", default=d(None), help="also write the results to this JSON file")


def _add_closed_loop_options(ap: argparse.ArgumentParser, closed_loop: bool) -> None:
    if closed_loop:
        ap.add_argument("--task", default="lift", help="lift, pick_place_can, stack")
        ap.add_argument("--kind", choices=("image", "lowdim"), default="image", help="the policy")
    ap.add_argument(
        "--demos",
        type=int,
        default=150,
        help="expert demonstrations (defaults: the recipe measured to learn Lift from cameras, "
        "docs/learning.md)",
    )
    ap.add_argument("--train-steps", type=int, default=8000, help="BC optimiser steps")
    ap.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate")
    ap.add_argument(
        "--lr-schedule",
        choices=LR_SCHEDULES,
        default="cosine",
        help="constant, or cosine decay to 0 over the run",
    )
    ap.add_argument(
        "--eef-state",
        action="store_true",
        help="an image policy also reads the end-effector pose (PolicyConfig.use_eef_state)",
    )
    ap.add_argument(
        "--policy",
        default="",
        metavar="YAML",
        help="further PolicyConfig fields as a YAML mapping, e.g. '{window: 2, embed_dim: 32}' "
        "(a recipe under test)",
    )
    ap.add_argument("--eval-episodes", type=int, default=50, help="seeded evaluation episodes")
    ap.add_argument("--seed", type=int, default=0, help="demo/train/eval seed")
    ap.add_argument(
        "--encoder-objective",
        choices=OBJECTIVES,
        help="the image policy reads a frozen fleet trunk this one robot first trains on its "
        "demonstrations' frames with this objective (default: the scratch trunk)",
    )
    ap.add_argument(
        "--encoder-rounds",
        type=int,
        default=3,
        help="fleet encoder: rounds (a fresh optimiser each)",
    )
    ap.add_argument("--encoder-steps", type=int, default=100, help="fleet encoder: steps per round")
    ap.add_argument(
        "--encoder-file",
        help="where the encoder's trunk is written (default: next to --json, else a temporary "
        "directory)",
    )


def build_parser() -> argparse.ArgumentParser:
    """``fed-ros bench train [steps options]`` times training steps; the other modes are
    subcommands: ``lift``, ``closed-loop`` and ``data-path``."""
    ap = argparse.ArgumentParser(prog="fed-ros bench train", description=__doc__.splitlines()[0])
    _add_device_options(ap, sub=False)
    ap.add_argument("--kinds", default="lowdim,image", help="comma list of image,lowdim")
    ap.add_argument("--steps", type=int, default=20, help="timed steps per mode (interleaved)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed warm-up steps")
    ap.add_argument(
        "--episodes",
        type=int,
        default=4,
        help="synthetic episodes (of max(40, batch) frames); more episodes mean "
        "fewer frames shared between a batch's windows",
    )
    ap.add_argument(
        "--amp",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="bf16 autocast on CUDA (no effect on CPU)",
    )
    sub = ap.add_subparsers(dest="mode", metavar="{lift,closed-loop,data-path}")
    lift = sub.add_parser(
        "lift",
        help="Lift success of the camera policy trained from scripted demos (MuJoCo, in "
        "process); = closed-loop --task lift --kind image",
    )
    _add_device_options(lift, sub=True)
    _add_closed_loop_options(lift, closed_loop=False)
    loop = sub.add_parser(
        "closed-loop", help="success of a policy trained by BC on --task's scripted demos"
    )
    _add_device_options(loop, sub=True)
    _add_closed_loop_options(loop, closed_loop=True)
    data = sub.add_parser(
        "data-path",
        help="windows/s of the image data path, demonstrations on the host vs on the device",
    )
    _add_device_options(data, sub=True)
    data.add_argument("--steps", type=int, default=20, help="timed batches per batch size")
    return ap


def _with_subcommand(argv: list[str]) -> list[str]:
    """``--lift`` / ``--closed-loop`` / ``--data-path`` (the old flags) as their subcommand."""
    flags = [a for a in argv if a in LEGACY_MODE_FLAGS]
    if not flags:
        return argv
    mode = "closed-loop" if "--closed-loop" in flags else LEGACY_MODE_FLAGS[flags[0]]
    return [mode, *(a for a in argv if a not in LEGACY_MODE_FLAGS)]


def main(argv: list[str] | None = None) -> int:
    """Run the chosen mode (training steps by default) and print its table; returns 0."""
    import sys

    ap = build_parser()
    args = ap.parse_args(_with_subcommand(list(sys.argv[1:] if argv is None else argv)))
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    if args.mode == "data-path":
        return _data_path(args, device)
    if args.mode in ("lift", "closed-loop"):
        closed = args.mode == "closed-loop"
        task, kind = (args.task, args.kind) if closed else ("lift", "image")
        try:
            overrides = policy_overrides(args.policy, kind)
            encoder = _encoder_config(args, kind)
        except ValueError as exc:
            ap.error(str(exc))
        row = lift_from_images(
            args.demos,
            args.train_steps,
            args.eval_episodes,
            args.seed,
            args.lr,
            args.batch,
            args.image_profile,
            device,
            args.lr_schedule,
            task,
            kind,
            eef_state=args.eef_state,
            policy_overrides=overrides,
            encoder=encoder,
            encoder_path=args.encoder_file
            or (args.json and str(Path(args.json).with_suffix(".encoder.safetensors"))),
        )
        _write_json(args.json, row)
        return 0
    return _steps(ap, args, device)


def _encoder_config(args: argparse.Namespace, kind: str) -> FleetEncoderConfig | None:
    """``--encoder-*``'s FleetEncoderConfig (None without ``--encoder-objective``);
    ValueError names a bad value or a policy kind without cameras."""
    if args.encoder_objective is None:
        return None
    if kind != "image":
        raise ValueError(f"--encoder-objective needs the image policy, got --kind {kind}")
    return FleetEncoderConfig(
        objective=args.encoder_objective,
        rounds=args.encoder_rounds,
        local_steps=args.encoder_steps,
        seed=args.seed,
    )


def _write_json(path: str | None, data: Any) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(data, f, indent=2)


def _data_path(args: argparse.Namespace, device: torch.device) -> int:
    from fed_ros.bench.train_data_path import data_path_rows, print_data_path

    batches = (8, 32) if args.quick else (32, 512)
    rows = data_path_rows(device, batches, steps=args.steps, image_profile=args.image_profile)
    print_data_path(rows, device)
    _write_json(args.json, rows)
    return 0


def _steps(ap: argparse.ArgumentParser, args: argparse.Namespace, device: torch.device) -> int:
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    for k in kinds:
        if k not in ("image", "lowdim"):
            ap.error(f"unknown policy kind {k!r}")
    if args.quick:
        args.batch, args.steps, args.warmup = min(args.batch, 8), min(args.steps, 3), 1
    print(
        f"fed-ros bench train: device={device} threads={torch.get_num_threads()} "
        f"batch={args.batch} steps={args.steps} per mode, interleaved (median step time) "
        f"amp={'bf16' if args.amp and device.type == 'cuda' else 'off'}"
    )
    rows = [
        bench_kind(
            k,
            device,
            args.batch,
            args.steps,
            args.warmup,
            image_profile=args.image_profile,
            amp=args.amp,
            episodes=args.episodes,
        )
        for k in kinds
    ]
    _print_table(rows)
    print(
        "ratio = FedDRMan/BC step cost, median over batches of the pair of steps on the same "
        "batch (the modes take turns): wall clock on CUDA, process CPU time on CPU (robust to "
        "other load; 'wall x' is the wall-clock ratio). cpu-s: CPU seconds per step."
    )
    print(
        "peak memory: CUDA allocator peak per mode on GPU; process max RSS on CPU "
        "(cumulative, so the FedDRMan column includes the BC run)"
    )
    _write_json(args.json, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
