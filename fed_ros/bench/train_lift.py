"""`fed-ros bench train lift` / `closed-loop`: does a policy learn a task from demonstrations?

A separate check from the throughput table of `train`: it collects scripted demonstrations of a
task (Lift by default; `--task pick_place_can`, `stack`) with both cameras for the image policy
(MuJoCo, in process), trains plain BC (from the images, or from the low-dim state with `--kind
lowdim`) and reports closed-loop success over seeded evaluation episodes, with wall and CPU
minutes per phase. It needs the
simulator and real demonstrations, where the throughput table runs on synthetic batches alone, so
it stands apart from it.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import yaml

from fed_ros.core.data.episode import Episode
from fed_ros.learning.configuration_fleet_encoder import FleetEncoderConfig
from fed_ros.learning.configuration_policy import PolicyConfig
from fed_ros.learning.configuration_trainer import TrainerConfig
from fed_ros.learning.trainer import initial_state_dict


def policy_overrides(text: str, kind: str = "image") -> dict[str, Any]:
    """``--policy``'s YAML mapping of PolicyConfig fields, checked against ``kind``'s config.

    Raises ValueError naming the text, an unknown field or a bad value, so a typo in a recipe
    fails at once rather than after minutes of demonstration collection.
    """
    if not text.strip():
        return {}
    value = yaml.safe_load(text)
    if not isinstance(value, Mapping):
        raise ValueError(f"--policy must be a YAML mapping of PolicyConfig fields, got {text!r}")
    PolicyConfig.from_dict({"kind": kind, **value})
    return dict(value)


def one_robot_encoder(
    episodes: Sequence[Episode], cfg: FleetEncoderConfig, path: str | Path
) -> dict[str, Any]:
    """The fleet encoder stage with a fleet of one: ``cfg.rounds`` rounds of
    ``cfg.local_steps`` steps on every frame of ``episodes`` (failed demonstrations too: the
    objective asks nothing of the actions), the trunk written to ``path``. Each round starts
    a fresh optimiser, as a robot's round does. Returns the stage's record."""
    from fed_ros.learning.fleet_encoder import initial_encoder_state, save_backbone, train_encoder

    c0 = time.process_time()
    state = initial_encoder_state(cfg)
    rounds = []
    for r in range(cfg.rounds):
        result = train_encoder(state, episodes, cfg, seed=cfg.seed * 1000 + r)
        state = result.params
        rounds.append({k: result.metrics[k] for k in ("loss_first", "loss_last", "cpu_s")})
        print(
            f"  encoder round {r} ({cfg.objective}): loss {rounds[-1]['loss_first']:.4f} -> "
            f"{rounds[-1]['loss_last']:.4f} ({rounds[-1]['cpu_s']:.0f} CPU s)",
            flush=True,
        )
    save_backbone(state, path)
    return {
        "config": cfg.to_dict(),
        "frames": sum(len(e) for e in episodes),
        "rounds": rounds,
        "file": str(path),
        "cpu_minutes": (time.process_time() - c0) / 60,
    }


def lift_from_images(
    demos: int,
    steps: int,
    eval_episodes: int,
    seed: int = 0,
    lr: float = 1e-3,
    batch_size: int = 32,
    image_profile: str = "lite",
    device: torch.device | None = None,
    lr_schedule: str = "constant",
    task: str = "lift",
    kind: str = "image",
    eef_state: bool = False,
    policy_overrides: Mapping[str, Any] | None = None,
    encoder: FleetEncoderConfig | None = None,
    encoder_path: str | Path | None = None,
) -> dict[str, Any]:
    """Collect demos of ``task`` (with cameras for ``kind`` image), train BC, evaluate in closed
    loop.

    Plain BC (no teacher: from a fresh model the distillation terms only pull towards the
    random initialisation). Prints and returns demos, frames, steps, minutes per phase and
    the success rate over ``eval_episodes`` seeded episodes. ``policy_overrides`` sets further
    ``PolicyConfig`` fields (a recipe under test: window, keypoints, widths, ...); an unknown
    field or a bad value raises ValueError naming it, before any demonstration is collected.
    With ``encoder``, the image policy reads a frozen fleet trunk that one robot trained on
    its own demonstrations' frames first (`one_robot_encoder`, written to ``encoder_path``,
    default a new temporary directory); its CPU counts as training.
    """
    os.environ.setdefault("MUJOCO_GL", "egl")  # before anything imports mujoco
    from fed_ros.learning.runner import PolicyRunner
    from fed_ros.learning.trainer import train_local
    from fed_ros.sim.collect import collect_demos
    from fed_ros.sim.evaluate import evaluate

    device = device or torch.device("cpu")
    cameras = kind == "image"
    fields: dict[str, Any] = {"kind": kind, "image_profile": image_profile}
    if eef_state:
        fields["use_eef_state"] = True
    weights: Path | None = None  # the one-robot encoder's trunk file
    if encoder is not None:
        if kind != "image":
            raise ValueError(f"a fleet encoder serves the image policy, got kind={kind!r}")
        weights = Path(
            encoder_path or Path(tempfile.mkdtemp(prefix="fed_ros_encoder_")) / "fleet.safetensors"
        )
        # The fleet trunk's forward is cheaper than hashing a frame for the feature cache
        # (docs/learning.md), so it is recomputed; an override may still turn the cache on.
        fields.update(
            vision_backbone="fleet", backbone_weights=str(weights), backbone_cache_frames=0
        )
    cfg = PolicyConfig.from_dict({**fields, **dict(policy_overrides or {})})
    t0, c0 = time.perf_counter(), time.process_time()
    episodes = collect_demos(
        task,
        "default",
        n=demos,
        seed=seed,
        cameras=cameras,
        image_size=cfg.image_size,
        noise_std=0.05,
    )
    t1, c1 = time.perf_counter(), time.process_time()
    ok = sum(e.success for e in episodes)
    frames = sum(len(e) for e in episodes if e.success)
    print(
        f"{task}: {ok}/{demos} successful demos, {frames} frames, {(t1 - t0) / 60:.1f} min",
        flush=True,
    )
    encoder_row = None
    if encoder is not None and weights is not None:
        encoder_row = one_robot_encoder(episodes, encoder, weights)
    te, ce = time.perf_counter(), time.process_time()
    start = initial_state_dict(cfg, seed=seed, episodes=episodes)
    tc = TrainerConfig(
        device=str(device),
        lr=lr,
        lr_schedule=lr_schedule,
        batch_size=batch_size,
        epochs=1_000_000,
        max_steps=steps,
        use_sub=False,
        use_act=False,
        val_fraction=0.0,
        seed=seed,
        progress=False,
    )

    def report(step: int, values: dict[str, float]) -> None:
        if step % 250 == 0 or step == steps:
            print(
                f"  step {step}: bc {values['bc']:.3f} ({time.perf_counter() - te:.0f} s)",
                flush=True,
            )

    result = train_local(start, episodes, cfg, tc, on_step=report)
    t2, c2 = time.perf_counter(), time.process_time()
    instruction = episodes[0].instruction
    ev = evaluate(
        lambda: PolicyRunner(result.params, cfg, device=str(device), instruction=instruction),
        task,
        "default",
        episodes=eval_episodes,
        seed=seed,
        cameras=cameras,
        image_size=cfg.image_size,
    )
    t3, c3 = time.perf_counter(), time.process_time()
    row: dict[str, Any] = {
        "task": task,
        "kind": kind,
        "image_profile": image_profile,
        "eef_state": cfg.use_eef_state,
        "policy_overrides": dict(policy_overrides or {}),
        "policy": cfg.to_dict(),
        "demos": demos,
        "successful_demos": ok,
        "frames": frames,
        "steps": steps,
        "lr": lr,
        "lr_schedule": lr_schedule,
        "batch": batch_size,
        "train_steps_per_s": result.metrics["steps_per_s"],
        "loss_bc": result.metrics["loss_bc"],
        "eval_episodes": eval_episodes,
        "success_rate": ev.success_rate,
        "successes": [bool(x) for x in ev.successes],
        "minutes": {
            "collect": (t1 - t0) / 60,
            "encoder": (te - t1) / 60,
            "train": (t2 - te) / 60,
            "evaluate": (t3 - t2) / 60,
            "total": (t3 - t0) / 60,
        },
        "cpu_minutes": {
            "collect": (c1 - c0) / 60,
            "encoder": (ce - c1) / 60,
            "train": (c2 - ce) / 60,
            "evaluate": (c3 - c2) / 60,
            "total": (c3 - c0) / 60,
        },
        "encoder": encoder_row,
        "threads": torch.get_num_threads(),
        "seed": seed,
    }
    trunk = f"fleet encoder, {encoder.objective}" if encoder is not None else image_profile
    source = f"images ({trunk})" if cameras else "low-dim state"
    print(
        f"{task} from {source}: {demos} demos ({frames} frames), {steps} BC "
        f"steps at {row['train_steps_per_s']:.2f} steps/s, success "
        f"{sum(ev.successes)}/{eval_episodes} = {ev.success_rate:.2f}; minutes "
        + ", ".join(f"{k} {v:.1f}" for k, v in row["minutes"].items())
        + "; CPU minutes "
        + ", ".join(f"{k} {v:.1f}" for k, v in row["cpu_minutes"].items())
    )
    return row
