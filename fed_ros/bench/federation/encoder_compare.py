"""Side by side, on recorded Lift camera demonstrations: the fleet encoder's objective and a
policy's held-out NLL on fleet-encoder features against the from-scratch camera trunk.

    python -m fed_ros.bench.federation.encoder_compare --out runs/encoder_compare

The cross-family camera fleet (normal and mirrored-mount Lift arms, cameras at 84 px, the
federation bench's scripted demos, cached under ``<out>/demos``); each robot keeps its last
demonstration out. Encoder: the fleet's (FedAvg over every robot) against one robot's own
(same steps, its frames only) and the untrained one, on every held-out frame. Policy: each
robot's Local policy (the image benchmark's policy), the same steps from the same start,
with the `lite` scratch trunk or the frozen fleet encoder; held-out NLL and process CPU.
No rollouts: the success rates of issue 37 are `fed-ros bench federation` runs.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence


def _policy_run(
    policy_cfg: Any, train: list, val: list, steps: int, lr: float, seed: int
) -> dict[str, float]:
    from fed_ros.learning.configuration_trainer import TrainerConfig
    from fed_ros.learning.trainer import initial_state_dict, train_local

    t0 = time.process_time()
    start = initial_state_dict(policy_cfg, seed=seed, episodes=train)
    tc = TrainerConfig(
        device="cpu", progress=False, epochs=steps, max_steps=steps, lr=lr, seed=seed
    )
    res = train_local(start, train, policy_cfg, tc, val_episodes=val)
    return {
        "val_nll": float(res.metrics["val_nll"]),
        "loss_bc": float(res.metrics["loss_bc"]),
        "cpu_s": time.process_time() - t0,
        "steps": steps,
    }


def compare(
    out: Path,
    robots: int,
    demos: int,
    encoder_rounds: int,
    encoder_steps: int,
    policy_steps: int,
    objective: str,
    seed: int,
) -> dict[str, Any]:
    """Run the comparison; its JSON record (also written to ``<out>/encoder_compare.json``)."""
    import torch

    from fed_ros.bench.federation.demos import DemoCache
    from fed_ros.bench.federation.encoder import FleetEncoderStage
    from fed_ros.bench.federation.image import IMAGE_PROFILE, image_setting
    from fed_ros.bench.federation.run import make_clients
    from fed_ros.bench.federation.settings import with_overrides
    from fed_ros.learning.configuration_fleet_encoder import FleetEncoderConfig
    from fed_ros.learning.fleet_encoder import evaluate_encoder, initial_encoder_state

    torch.set_num_threads(1)
    prof = with_overrides(IMAGE_PROFILE, robots=robots, demos_per_robot=demos + 1)
    setting = image_setting(prof)
    cpu0 = time.process_time()
    data = DemoCache(out / "demos", noise_std=prof.noise_std).robot_data(setting)
    record_cpu = time.process_time() - cpu0
    train = {rid: eps[:-1] for rid, eps in data.items()}
    val = {rid: eps[-1:] for rid, eps in data.items()}
    held_out = [e for eps in val.values() for e in eps]
    enc_cfg = FleetEncoderConfig(
        objective=objective, rounds=encoder_rounds, local_steps=encoder_steps, seed=seed
    )
    stage = FleetEncoderStage(enc_cfg, out / "fleet_encoder.safetensors")
    scratch_cfg = prof.policy_config()
    fleet_cfg = stage.policy_config(replace(scratch_cfg, vision_backbone="fleet"))
    clients = make_clients(setting.robot_ids, fleet_cfg, seed)
    cpu0 = time.process_time()
    rows = stage.run(clients, train)
    fleet_cpu = time.process_time() - cpu0
    # One robot alone, the same number of steps on its own frames only.
    first = setting.robot_ids[0]
    cpu0 = time.process_time()
    alone = initial_encoder_state(enc_cfg)
    for r in range(encoder_rounds):
        alone = clients[first].fit_encoder(alone, enc_cfg, train[first], r).params
    alone_cpu = time.process_time() - cpu0
    encoder = {
        "objective": objective,
        "held_out_loss": {
            "untrained": evaluate_encoder(initial_encoder_state(enc_cfg), held_out, enc_cfg),
            f"one_robot ({first})": evaluate_encoder(alone, held_out, enc_cfg),
            "fleet": evaluate_encoder(stage.state, held_out, enc_cfg),
        },
        "rounds": rows,
        "fleet_stage_cpu_s": fleet_cpu,
        "one_robot_cpu_s": alone_cpu,
    }
    policy: dict[str, dict[str, Any]] = {}
    for rid in setting.robot_ids:
        policy[rid] = {
            name: _policy_run(cfg, train[rid], val[rid], policy_steps, prof.lr, seed)
            for name, cfg in (("scratch", scratch_cfg), ("fleet", fleet_cfg))
        }
    record = {
        "setting": setting.name,
        "robots": robots,
        "train_demos_per_robot": demos,
        "frames_per_robot": {rid: sum(len(e) for e in eps) for rid, eps in train.items()},
        "families": {rid: dict(mix) for rid, mix in zip(setting.robot_ids, setting.robots)},
        "encoder": encoder,
        "policy": policy,
        "policy_steps": policy_steps,
        "record_cpu_s": record_cpu,
        "total_cpu_s": time.process_time(),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "encoder_compare.json").write_text(json.dumps(record, indent=1))
    return record


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; prints the record's summary."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="runs/encoder_compare")
    ap.add_argument("--robots", type=int, default=4)
    ap.add_argument("--demos", type=int, default=4, help="training demos per robot (+1 held out)")
    ap.add_argument("--encoder-rounds", type=int, default=3)
    ap.add_argument("--encoder-steps", type=int, default=60)
    ap.add_argument("--policy-steps", type=int, default=150)
    ap.add_argument("--objective", default="proprio")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    rec = compare(
        Path(a.out),
        a.robots,
        a.demos,
        a.encoder_rounds,
        a.encoder_steps,
        a.policy_steps,
        a.objective,
        a.seed,
    )
    print(
        json.dumps({"encoder": rec["encoder"]["held_out_loss"], "policy": rec["policy"]}, indent=1)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
