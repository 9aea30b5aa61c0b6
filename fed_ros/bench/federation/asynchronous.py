"""Synchronous vs buffered asynchronous rounds on a fleet with one slow robot:
`fed-ros bench async` (issue 26 item 3).

Each cell drives the fleet's real round coordinator (`fed_ros.core.rounds.coordinator`, with
its model store) and real strategy, the robots' own client (`RobotClient`: real training) and
MuJoCo evaluation, on a *virtual clock*: a robot's local round takes 1 time unit, the slow
robot's ``slow_factor`` units (a Jetson beside workstations). Synchronous rounds wait for every
robot; buffered rounds (``buffer_size`` B, FedBuff) close a cluster as soon as B of its updates
are in, and the slow robot's updates arrive stale. Both run for the same virtual time (the
synchronous fleet's ``rounds`` rounds) and are evaluated at the same instants, so the table
compares success at equal time: the time to reach a target success, and the final success.

Time is virtual so that the comparison does not depend on the benchmark machine's load; the
report converts units to seconds with the measured median CPU time of a fast robot's local
round. The slow robot's training is real (it takes as long to compute as the others'); only
when its update arrives is modelled.
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fed_ros.bench.federation.demos import DemoCache
from fed_ros.bench.federation.evaluation import Evaluator
from fed_ros.bench.federation.methods import Method, method_by_name
from fed_ros.bench.federation.run import eval_horizons, make_clients, save_json
from fed_ros.bench.federation.asynchronous_report import format_report, report_rows
from fed_ros.bench.federation.settings import PROFILES, Profile, Setting, cross_family

MODES = ("sync", "async")


@dataclass(frozen=True)
class PacedSpec:
    """One cell: a setting, a method, a seed and a round mode, with the fleet's pace."""

    setting: Setting
    method: Method
    seed: int
    profile: Profile
    mode: str
    slow_factor: float = 3.0
    buffer_size: int = 2
    max_staleness: int = 8

    @property
    def key(self) -> str:
        """File-name key of the cell."""
        pace = f"slow{self.slow_factor:g}"
        buffer = f"_b{self.buffer_size}" if self.mode == "async" else ""
        return f"{self.setting.name}__{self.method.name}__s{self.seed}__{self.mode}{buffer}_{pace}"

    @property
    def horizon(self) -> float:
        """Virtual time both modes run: the synchronous fleet's ``rounds`` rounds."""
        return self.profile.rounds * self.slow_factor

    @property
    def checkpoints(self) -> list[float]:
        """Evaluation instants: the end of every synchronous round."""
        return [self.slow_factor * (k + 1) for k in range(self.profile.rounds)]


def run_paced(spec: PacedSpec, cache: DemoCache) -> dict[str, Any]:
    """Run one cell and return its JSON record (rounds, evaluations, timings)."""
    import torch

    from fed_ros.core.rounds.buffered import BufferSettings
    from fed_ros.core.rounds.collect import DONE, TRAIN
    from fed_ros.core.rounds.coordinator import RoundCoordinator
    from fed_ros.core.rounds.settings import RoundSettings
    from fed_ros.core.rounds.store import ModelStore
    from fed_ros.core.strategies.aggregate import weighted_model
    from fed_ros.core.strategies.base import make_strategy
    from fed_ros.core.strategies.types import ClientUpdate
    from fed_ros.learning.trainer import initial_state_dict

    if spec.mode not in MODES:
        raise ValueError(f"mode must be one of {list(MODES)}, got {spec.mode!r}")
    torch.set_num_threads(1)
    setting, method, profile = spec.setting, spec.method, spec.profile
    policy_cfg = profile.policy_config()
    data = cache.robot_data(setting)
    ids = setting.robot_ids
    slow = ids[-1]
    pace = {rid: (spec.slow_factor if rid == slow else 1.0) for rid in ids}
    strategy = make_strategy(
        method.strategy,
        **method.strategy_settings(setting.num_clusters),
        lr=profile.lr,
        local_steps=profile.local_steps,
    )
    buffer = BufferSettings(
        buffer_size=spec.buffer_size if spec.mode == "async" else 0,
        max_staleness=spec.max_staleness,
    )
    settings = RoundSettings(
        algorithm=method.strategy,
        rounds=10**6,  # the virtual horizon ends the run
        quorum_fraction=1.0,
        round_timeout_s=1e12,
        buffer=buffer,
    )
    clients = make_clients(ids, policy_cfg, spec.seed)
    evaluator = Evaluator(
        policy_cfg,
        profile.eval_episodes,
        seed=spec.seed,
        max_steps=eval_horizons(setting, data, profile.eval_horizon_factor),
    )
    now = [0.0]
    record: dict[str, Any] = {
        "key": spec.key,
        "setting": setting.name,
        "method": method.name,
        "seed": spec.seed,
        "mode": spec.mode,
        "slow_robot": slow,
        "slow_factor": spec.slow_factor,
        "buffer_size": spec.buffer_size if spec.mode == "async" else 0,
        "profile": profile.to_json(),
        "rounds": [],
        "evals": [],
        "fits": {rid: 0 for rid in ids},
        "rejected": [],
    }
    fit_cpu: list[float] = []
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        coord = RoundCoordinator(
            strategy,
            ModelStore(Path(tmp) / "store"),
            settings,
            initial_state_dict(policy_cfg, seed=spec.seed),
            clock=lambda: now[0],
        )
        for rid in ids:
            coord.register(rid, tasks=[setting.family(setting.dominant_family(0)).task])
        in_flight: dict[str, tuple[float, Any]] = {}
        trained_for: dict[str, int] = {}

        def launch(plan: Any) -> None:
            """Every robot not training and not done with this round starts on it."""
            if plan is None or plan.stage != TRAIN:
                return
            models = coord.cluster_models
            for rid in plan.participants:
                if rid in in_flight or trained_for.get(rid, -1) >= plan.round_idx:
                    continue
                membership, config = plan.memberships[rid], plan.configs[rid]
                start = clients[rid].choose_start(
                    membership, lambda m: weighted_model(models, m), config, data[rid]
                )
                cpu0 = time.process_time()
                res = clients[rid].fit(start.model, config, data[rid], plan.round_idx)
                if rid != slow:
                    fit_cpu.append(time.process_time() - cpu0)
                update = ClientUpdate(
                    robot_id=rid,
                    params=res.params,
                    num_samples=res.num_samples,
                    base_round=plan.round_idx,
                    cluster_id=start.cluster_id,
                    metrics=dict(res.metrics),
                )
                update.round_idx = plan.round_idx
                trained_for[rid] = plan.round_idx
                record["fits"][rid] += 1
                in_flight[rid] = (now[0] + pace[rid], update)

        def evaluate(at: float) -> None:
            models = {rid: coord.strategy.model_for(rid) for rid in ids}
            ev = evaluator.evaluate_fleet(setting, models)
            record["evals"].append({"t": at, "round": coord.round_idx, **ev})

        try:
            launch(coord.start_round(now[0]))
            pending = list(spec.checkpoints)
            while pending:
                nxt = min(in_flight.items(), key=lambda kv: (kv[1][0], kv[0]), default=None)
                if nxt is None or nxt[1][0] > pending[0]:
                    now[0] = pending[0]
                    evaluate(pending.pop(0))
                    if nxt is None:  # nothing in flight: the robots take the open round again
                        launch(coord.current_plan)
                        if not in_flight:
                            break
                    continue
                rid, (finish, update) = nxt
                del in_flight[rid]
                now[0] = finish
                verdict = coord.offer_update(update, finish)
                if not verdict.accepted:
                    record["rejected"].append([finish, rid, verdict.reason])
                plan, outcome = coord.poll(finish)
                if outcome is not None:
                    record["rounds"].append(
                        {
                            "round": outcome.round_idx,
                            "t": finish,
                            "status": outcome.status,
                            "accepted": outcome.updates_accepted,
                            "buffered": {
                                k: v
                                for k, v in outcome.diagnostics.items()
                                if k.startswith("buffered/")
                            },
                        }
                    )
                if plan is not None and plan.stage == DONE:
                    break
                launch(plan or coord.current_plan)
        finally:
            evaluator.close()
    record["fast_round_cpu_s"] = statistics.median(fit_cpu) if fit_cpu else math.nan
    record["wall_s"] = time.perf_counter() - t_start
    record["final"] = record["evals"][-1] if record["evals"] else {}
    return record


# --------------------------------------------------------------------------- CLI


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="fed-ros bench async",
        description="synchronous vs buffered asynchronous (FedBuff) rounds on a fleet with one "
        "slow robot: success at equal virtual time",
    )
    ap.add_argument("--profile", choices=sorted(PROFILES), default="quick")
    ap.add_argument("--methods", nargs="+", default=["fedavg", "feddrman"])
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--robots", type=int, default=6, help="fleet size (half mirrored arms)")
    ap.add_argument("--rounds", type=int, help="synchronous rounds (sets the virtual horizon)")
    ap.add_argument("--local-steps", type=int)
    ap.add_argument("--demos", type=int, help="demonstrations per robot")
    ap.add_argument("--eval-episodes", type=int)
    ap.add_argument("--slow-factor", type=float, default=3.0, help="the slow robot's pace")
    ap.add_argument("--buffer-size", type=int, default=2, help="B of the buffered rounds")
    ap.add_argument("--max-staleness", type=int, default=8)
    ap.add_argument("--target", type=float, default=0.5, help="success the time is measured to")
    ap.add_argument("--out", default="runs/bench_async")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """`fed-ros bench async`: run missing cells, then print and write the report."""
    import json

    from tqdm.auto import tqdm

    args = _parser().parse_args(argv)
    if not args.slow_factor >= 1.0:
        raise SystemExit(f"--slow-factor must be >= 1, got {args.slow_factor}")
    if args.buffer_size < 1:
        raise SystemExit(f"--buffer-size must be >= 1, got {args.buffer_size}")
    changes = {
        "robots": args.robots,
        "rounds": args.rounds,
        "local_steps": args.local_steps,
        "demos_per_robot": args.demos,
        "eval_episodes": args.eval_episodes,
    }
    profile = replace(PROFILES[args.profile], **{k: v for k, v in changes.items() if v is not None})
    setting = cross_family(profile)
    out = Path(args.out)
    cache = DemoCache(out / "demos", noise_std=profile.noise_std)
    specs = [
        PacedSpec(
            setting,
            method_by_name(m),
            seed,
            profile,
            mode,
            args.slow_factor,
            args.buffer_size,
            args.max_staleness,
        )
        for m in args.methods
        for seed in args.seeds
        for mode in args.modes
    ]
    cells = []
    # A bar with an ETA in a terminal; nothing in logs and CI (tqdm's disable=None: not a TTY).
    with tqdm(total=len(specs), desc="async cells", unit="cell", disable=None) as bar:
        for spec in specs:
            path = out / "cells" / f"{spec.key}.json"
            if path.exists():
                cells.append(json.loads(path.read_text()))
            else:
                record = run_paced(spec, cache)
                save_json(path, record)
                cells.append(json.loads(path.read_text()))
            bar.update(1)
    text = format_report(report_rows(cells, args.target), args.target, args.slow_factor)
    print(text)
    (out / "report.md").write_text(text + "\n")
    print(f"\nreport: {out / 'report.md'}")
    return 0
