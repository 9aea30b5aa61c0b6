"""Tune `make demo`'s schedule in process (no ROS): the demo fleet's FedDRMan rounds, fast.

Reproduces config/fleet_demo.yaml's fleet with the benchmark's public round
(`fed_ros.bench.federation.run.federation_round` / `make_clients`, which
test/slow/test_fleet_bench_equivalence.py proves gives the ROS fleet's cluster models bit for
bit for the same demos): robots robot_0..3, tasks lift (variations default, default,
mirrored_mount, mirrored_mount), FedDRMan with num_clusters 2, fleet seed 0, the low-dim
policy `PolicyConfig(kind="lowdim")`, robot i seeded as the fleet plan seeds it (training
seed i, demo_seed 1000 * i, evaluation seed i) with the robot node's own training defaults
(`RobotParams.local_training()`; the round config's lr / local_steps win). Demonstrations
are what the robot node's expert records over ROS (`fed_ros.ros.arm.driving.
record_expert_demos`: episode k reset with `episode_seed(demo_seed, k)`, a fresh noiseless
expert per episode, failures skipped until `demos` successes), cached as Episode .npz under
``<out>/demos``. After every round each robot rolls out its cluster model
(`strategy.model_for`) on its own family for ``eval`` seeded episodes (the robot node's
`run_policy` seeds, deterministic actions, ``max_steps`` per episode), as the demo's
EVALUATE stage does (``--eval-last N``: only in the last N rounds, to search faster).

A configuration is ``ROUNDS:STEPS:LR:DEMOS:EVAL:MAX_STEPS`` (e.g. ``8:100:1e-3:20:4:150``).
Each runs in its own process (``--jobs`` at most 2, one torch thread each) and writes
``<out>/<config>.json`` (per-round success per robot and family, BC loss, clusters,
training / evaluation CPU and wall seconds, control steps rolled out); finished
configurations are skipped on a rerun. The summary table is printed at the end.

    MUJOCO_GL=egl nice .venv/bin/python tools/tune_demo.py --out /tmp/tune_demo --jobs 2 \\
        8:100:1e-3:20:4:150 6:60:3e-3:10:4:150
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")

ROBOTS = (
    ("robot_0", "default"),
    ("robot_1", "default"),
    ("robot_2", "mirrored_mount"),
    ("robot_3", "mirrored_mount"),
)
TASK = "lift"
FLEET_SEED = 0


def family(variation: str) -> str:
    """The demo table's family name (task, plus the variation when not default)."""
    return TASK if variation == "default" else f"{TASK}/{variation}"


def parse_config(text: str) -> dict:
    """``ROUNDS:STEPS:LR:DEMOS:EVAL:MAX_STEPS`` -> dict."""
    parts = text.split(":")
    if len(parts) != 6:
        raise argparse.ArgumentTypeError(
            f"config {text!r}: want ROUNDS:STEPS:LR:DEMOS:EVAL:MAX_STEPS"
        )
    r, s, lr, d, e, m = parts
    return {
        "name": text,
        "rounds": int(r),
        "local_steps": int(s),
        "lr": float(lr),
        "demos": int(d),
        "eval_episodes": int(e),
        "max_episode_steps": int(m),
    }


def robot_demos(
    out: Path, index: int, variation: str, count: int, max_steps: int, noise_std: float = 0.0
) -> list:
    """The robot node's start-up demonstrations (cached .npz per episode index); ``noise_std``
    is the robot's ``demo_noise_std`` (expert action noise while recording)."""
    from fed_ros.core.data.episode import Episode
    from fed_ros.sim.collect import STREAM_COLLECT, episode_seed, run_episode
    from fed_ros.sim.envs import make_env
    from fed_ros.sim.experts import make_expert

    noise = f"__noise{noise_std:g}" if noise_std else ""
    d = out / "demos" / f"robot_{index}__{variation}__max{max_steps}{noise}"
    d.mkdir(parents=True, exist_ok=True)
    demo_seed = 1000 * (FLEET_SEED + index)
    ok: list = []
    env = None
    k = 0
    try:
        while len(ok) < count and k < 2 * count + 2:
            path = d / f"demo_{k:04d}.npz"
            if path.exists():
                ep = Episode.load(path)
            else:
                if env is None:
                    env = make_env(TASK, variation, cameras=False, seed=FLEET_SEED + index)
                seed = episode_seed(demo_seed, k, STREAM_COLLECT)
                expert = make_expert(TASK, noise_std=noise_std, seed=seed, variation=variation)
                obs, actions, success = run_episode(env, expert, seed, max_steps=max_steps)
                ep = Episode(
                    task=TASK,
                    instruction=env.instruction,
                    observations=obs,
                    actions=actions,
                    variation=variation,
                    robot_id=f"robot_{index}",
                    success=bool(success),
                    metadata={"source": expert.source, "reset_seed": str(seed)},
                )
                ep.save(path)
            if ep.success:
                ok.append(ep)
            k += 1
    finally:
        if env is not None:
            env.close()
    return ok


def run_config(
    cfg: dict, out: str, eval_last: int = 0, noise_std: float = 0.0, policy: dict | None = None
) -> dict:
    """One in-process demo federation; returns (and saves) its record."""
    import numpy as np
    import torch

    from fed_ros.bench.federation.run import federation_round, make_clients
    from fed_ros.core.strategies.base import make_strategy
    from fed_ros.learning.configuration_policy import PolicyConfig
    from fed_ros.learning.runner import PolicyRunner
    from fed_ros.learning.trainer import initial_state_dict
    from fed_ros.ros.configuration.fleet_params import RobotParams
    from fed_ros.sim.envs import make_env
    from fed_ros.sim.evaluate import evaluate

    torch.set_num_threads(1)  # the fleet plan gives each simulated robot one torch thread
    outp = Path(out)
    ids = [rid for rid, _ in ROBOTS]
    data = {
        rid: robot_demos(outp, i, var, cfg["demos"], cfg["max_episode_steps"], noise_std)
        for i, (rid, var) in enumerate(ROBOTS)
    }
    policy_cfg = PolicyConfig(kind="lowdim", **(policy or {}))
    dflt = RobotParams.defaults()  # the robot node's local_training() with no trainer.* overrides
    local = {
        "lr": dflt["train_lr"],
        "batch_size": dflt["train_batch_size"],
        "max_steps": dflt["train_max_steps"] or None,
    }
    strategy = make_strategy(
        "feddrman", num_clusters=2, lr=cfg["lr"], local_steps=cfg["local_steps"]
    )
    strategy.initialize(initial_state_dict(policy_cfg, seed=FLEET_SEED), ids)
    clients = make_clients(ids, policy_cfg, FLEET_SEED, local=local)
    envs = {
        rid: make_env(TASK, var, cameras=False, seed=FLEET_SEED + i)
        for i, (rid, var) in enumerate(ROBOTS)
    }
    rec: dict = {
        "config": cfg,
        "local": local,
        "demo_noise_std": noise_std,
        "policy": policy or {},
        "rounds": [],
    }
    t_all = time.perf_counter()
    try:
        for r in range(cfg["rounds"]):
            row: dict = {"round": r}
            c0, w0 = time.process_time(), time.perf_counter()
            run = federation_round(strategy, clients, data, r)
            row["train_cpu_s"], row["train_wall_s"] = (
                time.process_time() - c0,
                time.perf_counter() - w0,
            )
            row["loss_bc"] = float(
                np.nanmean([u.metrics.get("loss_bc", np.nan) for u in run.updates])
            )
            row["clusters"] = {
                k: [[int(c), float(w)] for c, w in v] for k, v in run.result.assignments.items()
            }
            if eval_last and r < cfg["rounds"] - eval_last:
                rec["rounds"].append(row)
                print(
                    f"[{cfg['name']}] round {r}: not evaluated, loss {row['loss_bc']:.3f} "
                    f"train {row['train_wall_s']:.0f}s",
                    flush=True,
                )
                continue
            c0, w0 = time.process_time(), time.perf_counter()
            per_robot, steps = {}, 0
            for i, (rid, var) in enumerate(ROBOTS):
                res = evaluate(
                    PolicyRunner(strategy.model_for(rid), policy_cfg, device="cpu"),
                    TASK,
                    var,
                    episodes=cfg["eval_episodes"],
                    seed=FLEET_SEED + i,
                    cameras=False,
                    max_steps=cfg["max_episode_steps"],
                    env=envs[rid],
                )
                per_robot[rid] = float(res.success_rate)
                steps += int(sum(res.episode_lengths))
            row["eval_cpu_s"], row["eval_wall_s"] = (
                time.process_time() - c0,
                time.perf_counter() - w0,
            )
            row["eval_steps"] = steps
            row["success"] = per_robot
            row["per_family"] = {
                f: float(np.mean([per_robot[rid] for rid, v in ROBOTS if family(v) == f]))
                for f in dict.fromkeys(family(v) for _, v in ROBOTS)
            }
            rec["rounds"].append(row)
            print(
                f"[{cfg['name']}] round {r}: {row['per_family']} loss {row['loss_bc']:.3f} "
                f"train {row['train_wall_s']:.0f}s eval {row['eval_wall_s']:.0f}s",
                flush=True,
            )
    finally:
        for env in envs.values():
            env.close()
    rec["wall_s"] = time.perf_counter() - t_all
    rec["demo_steps"] = {rid: int(sum(len(e) for e in eps)) for rid, eps in data.items()}
    path = outp / result_name(cfg, noise_std, policy)
    path.write_text(json.dumps(rec, indent=1))
    return rec


def result_name(cfg: dict, noise_std: float, policy: dict | None) -> str:
    """Result file of one configuration with these demo-noise and policy settings."""
    extra = "".join(f"_{k}{v}" for k, v in sorted((policy or {}).items()))
    return (
        f"{cfg['name'].replace(':', '_')}{f'_noise{noise_std:g}' if noise_std else ''}{extra}.json"
    )


def summary(rec: dict) -> str:
    """One table block per configuration."""
    cfg = rec["config"]
    fams = list(rec["rounds"][-1]["per_family"])
    lines = [
        f"{cfg['name']} noise {rec.get('demo_noise_std', 0.0):g} policy {rec.get('policy', {})}  "
        f"(rounds:steps:lr:demos:eval/robot:max_steps)  wall {rec['wall_s']:.0f} s, "
        f"train cpu {sum(r['train_cpu_s'] for r in rec['rounds']):.0f} s, "
        f"eval cpu {sum(r.get('eval_cpu_s', 0) for r in rec['rounds']):.0f} s, "
        f"eval steps {sum(r.get('eval_steps', 0) for r in rec['rounds'])}",
        "round | " + " | ".join(fams) + " | loss_bc",
    ]
    for r in rec["rounds"]:
        pf = r.get("per_family")
        lines.append(
            f"{r['round']:5d} | "
            + " | ".join(f"{pf[f]:.2f}" if pf else "  -  " for f in fams)
            + f" | {r['loss_bc']:.3f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "configs", nargs="+", type=parse_config, help="ROUNDS:STEPS:LR:DEMOS:EVAL:MAX_STEPS"
    )
    ap.add_argument("--out", default="/tmp/tune_demo", help="cache and results directory")
    ap.add_argument(
        "--jobs", type=int, default=1, choices=(1, 2), help="configurations side by side"
    )
    ap.add_argument(
        "--eval-last",
        type=int,
        default=0,
        help="evaluate only the last N rounds (0: every round, as the demo does)",
    )
    ap.add_argument("--demo-noise", type=float, default=0.0, help="the robots' demo_noise_std")
    ap.add_argument(
        "--policy",
        action="append",
        default=[],
        metavar="KEY=INT",
        help="PolicyConfig override, e.g. num_modes=1 (repeatable)",
    )
    args = ap.parse_args(argv)
    policy = {k: int(v) for k, v in (item.split("=", 1) for item in args.policy)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # Demonstrations first, in this process (the workers only read the cache).
    for i, (_, var) in enumerate(ROBOTS):
        for m in sorted({c["max_episode_steps"] for c in args.configs}):
            robot_demos(
                out,
                i,
                var,
                max(c["demos"] for c in args.configs if c["max_episode_steps"] == m),
                m,
                args.demo_noise,
            )
    todo, done = [], []
    for c in args.configs:
        path = out / result_name(c, args.demo_noise, policy)
        (done.append(json.loads(path.read_text())) if path.exists() else todo.append(c))
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        n = len(todo)
        done += list(
            pool.map(
                run_config,
                todo,
                [str(out)] * n,
                [args.eval_last] * n,
                [args.demo_noise] * n,
                [policy] * n,
            )
        )
    for rec in done:
        print(summary(rec) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
