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
import time
from collections.abc import Mapping
from typing import Any

import torch
import yaml

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
) -> dict[str, Any]:
    """Collect demos of ``task`` (with cameras for ``kind`` image), train BC, evaluate in closed
    loop.

    Plain BC (no teacher: from a fresh model the distillation terms only pull towards the
    random initialisation). Prints and returns demos, frames, steps, minutes per phase and
    the success rate over ``eval_episodes`` seeded episodes. ``policy_overrides`` sets further
    ``PolicyConfig`` fields (a recipe under test: window, keypoints, widths, ...); an unknown
    field or a bad value raises ValueError naming it, before any demonstration is collected.
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
                f"  step {step}: bc {values['bc']:.3f} ({time.perf_counter() - t1:.0f} s)",
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
            "train": (t2 - t1) / 60,
            "evaluate": (t3 - t2) / 60,
            "total": (t3 - t0) / 60,
        },
        "cpu_minutes": {
            "collect": (c1 - c0) / 60,
            "train": (c2 - c1) / 60,
            "evaluate": (c3 - c2) / 60,
            "total": (c3 - c0) / 60,
        },
        "threads": torch.get_num_threads(),
        "seed": seed,
    }
    source = f"images ({image_profile})" if cameras else "low-dim state"
    print(
        f"{task} from {source}: {demos} demos ({frames} frames), {steps} BC "
        f"steps at {row['train_steps_per_s']:.2f} steps/s, success "
        f"{sum(ev.successes)}/{eval_episodes} = {ev.success_rate:.2f}; minutes "
        + ", ".join(f"{k} {v:.1f}" for k, v in row["minutes"].items())
        + "; CPU minutes "
        + ", ".join(f"{k} {v:.1f}" for k, v in row["cpu_minutes"].items())
    )
    return row
