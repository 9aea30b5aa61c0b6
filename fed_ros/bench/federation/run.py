"""In-process federation (no ROS) of `fed-ros bench federation`: rounds and cells.

Runs the fleet's real core strategies, the robots' own client (`fed_ros.learning.client.
RobotClient`) and MuJoCo evaluation in one process: per round (`federation_round`, the same
steps a fleet takes) the strategy configures each robot (membership + round config), robots
describe/score when asked, pick (IFCA) and fit obeying their round config, the strategy
aggregates; every ``eval_every`` rounds the robots' models are rolled out in MuJoCo with
seeded episodes. Cells are saved as JSON (resumable). The demos come from
`federation.demos.DemoCache`, the rollouts from `federation.evaluation.Evaluator`.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from fed_ros.bench.federation.demos import DemoCache
from fed_ros.bench.cluster_measures import coassignment, cosine_matrix, hard_clusters, intra_inter
from fed_ros.bench.federation.wire import encoding_suffix, model_encoding, send_update
from fed_ros.core.encodings.feedback import ErrorFeedback
from fed_ros.bench.federation.encoder import EncoderStageStore, FleetEncoderStage
from fed_ros.bench.federation.evaluation import Evaluator
from fed_ros.bench.federation.methods import Method
from fed_ros.bench.federation.settings import Profile, Setting
from fed_ros.core.data.episode import Episode
from fed_ros.learning.backbones.specs import FLEET
from fed_ros.learning.configuration_fleet_encoder import FleetEncoderConfig


def _jsonable(x: Any, depth: int = 0) -> Any:
    if depth > 6:
        return None
    if isinstance(x, (str, bool, int)) or x is None:
        return x
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return _jsonable(float(x))
    if isinstance(x, np.ndarray):
        return _jsonable(x.tolist(), depth + 1) if x.size <= 4096 else None
    if isinstance(x, dict):
        return {str(k): _jsonable(v, depth + 1) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v, depth + 1) for v in x]
    return str(x)


# --------------------------------------------------------------------------- one round

# The robots' own training settings in the benchmark: a fleet whose robot_defaults set
# `trainer.val_fraction: 0.0` (train on every demo); everything else comes from the strategy.
BENCH_LOCAL: dict[str, Any] = {"val_fraction": 0.0}


def make_clients(
    robot_ids: Sequence[str],
    policy_cfg: Any,
    fleet_seed: int,
    device: str = "cpu",
    local: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One RobotClient per robot, seeded as the fleet plan seeds robot i (fleet seed + i)."""
    from fed_ros.learning.client import RobotClient

    return {
        rid: RobotClient(
            rid,
            policy_cfg,
            robot_seed=fleet_seed + i,
            device=device,
            local=BENCH_LOCAL if local is None else local,
        )
        for i, rid in enumerate(robot_ids)
    }


def describe_round(
    clients: dict[str, Any], data: dict[str, list[Episode]], configs: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """DESCRIBE (and for RND, SCORE) stages as the fleet runs them, each robot obeying its round
    config (`RobotClient.stage_descriptor`, the robot node's call); plus the RND extras."""
    from fed_ros.core.rounds.collect import DESCRIBE, SCORE

    descs = {
        rid: c.stage_descriptor(DESCRIBE, configs[rid], data[rid]) for rid, c in clients.items()
    }
    extra: dict[str, Any] = {}
    if any(d.kind == "rnd" for d in descs.values()):
        # Every robot gets every peer's predictor (a robot never scores its own: it is held out).
        predictors = {rid: d.payload for rid, d in descs.items()}
        for rid, c in clients.items():
            scored = c.stage_descriptor(SCORE, configs[rid], data[rid], predictors)
            scored.payload = descs[rid].payload  # the server keeps the DESCRIBE predictor
            descs[rid] = scored
        ids = list(clients)
        extra["rnd_scores"] = [[descs[r].scores.get(p, 0.0) for p in ids] for r in ids]
        extra["rnd_residual_std"] = [descs[r].residual_std for r in ids]
        extra["rnd_cv_folds"] = [clients[r].rnd_fit.folds for r in ids]
    return descs, extra


@dataclass
class RoundRun:
    """One in-process round: the strategy's result, the robots' updates and start models."""

    result: Any
    updates: list[Any]
    starts: dict[str, dict[str, np.ndarray]]
    cluster_cpu_s: float
    extra: dict[str, Any]


def federation_round(
    strategy: Any,
    clients: dict[str, Any],
    data: dict[str, list[Episode]],
    round_idx: int,
    encoding: str = "float32",
    feedback: dict[str, Any] | None = None,
) -> RoundRun:
    """One round exactly as a fleet runs it (robot-id order): configure -> describe/score when
    asked -> each RobotClient chooses its start (IFCA: picks) and fits obeying its round config
    -> aggregate. ``encoding``: cluster models and updates travel under it (the robots start
    from the decoded models, the server aggregates the decoded updates), bytes counted. Under
    ``topk[:fraction]`` the updates are sparse deltas against the start model with each robot's
    error feedback kept in ``feedback`` (robot id -> ErrorFeedback, across rounds), models as
    float32 (`wire`)."""
    from fed_ros.core.encodings import encoded_nbytes, roundtrip
    from fed_ros.core.strategies.aggregate import weighted_model
    from fed_ros.core.strategies.types import ClientUpdate

    models_as = model_encoding(encoding)
    feedback = {} if feedback is None else feedback
    ids = sorted(clients)
    instructions = strategy.configure_round(round_idx, ids)
    models = {c: roundtrip(m, models_as) for c, m in strategy.cluster_models().items()}
    descs: dict[str, Any] = {}
    extra: dict[str, Any] = {
        "model_bytes": sum(encoded_nbytes(m, models_as) for m in models.values()),
        "update_bytes": 0,
    }
    cost = 0.0
    if strategy.needs_descriptors(round_idx):
        t0 = time.process_time()
        # The stage's extras join the round's (bytes counted above stay).
        descs, more = describe_round(clients, data, {r: instructions[r].config for r in ids})
        extra.update(more, descriptor_cpu_s=time.process_time() - t0)
        cost += extra["descriptor_cpu_s"]
    updates, starts = [], {}
    for rid in ids:
        membership, config = instructions[rid].membership, instructions[rid].config
        t0 = time.process_time()  # CPU time: comparable across runs on a shared machine
        start = clients[rid].choose_start(
            membership, lambda m: weighted_model(models, m), config, data[rid]
        )
        if (
            start.picked
        ):  # the client-side cost of clustering (IFCA's evaluation of every listed model)
            cost += time.process_time() - t0
        starts[rid] = start.model
        res = clients[rid].fit(start.model, config, data[rid], round_idx)
        received, nbytes = send_update(
            res.params,
            start.model,
            start.cluster_id,
            membership,
            start.picked,
            encoding,
            feedback.setdefault(rid, ErrorFeedback()),
        )
        extra["update_bytes"] += nbytes
        updates.append(
            ClientUpdate(
                robot_id=rid,
                params=received,
                num_samples=res.num_samples,
                base_round=round_idx,
                cluster_id=start.cluster_id,
                metrics=dict(res.metrics),
            )
        )
    t0 = time.process_time()
    result = strategy.aggregate_round(round_idx, updates, descs)
    extra["aggregate_cpu_s"] = time.process_time() - t0
    return RoundRun(result, updates, starts, cost + extra["aggregate_cpu_s"], extra)


# --------------------------------------------------------------------------- one cell


@dataclass
class CellSpec:
    """What one cell runs."""

    setting: Setting
    method: Method
    seed: int
    profile: Profile

    @property
    def key(self) -> str:
        """File-name key (a compressed run's cells are its own: ``__<encoding>``)."""
        enc = self.profile.encoding
        suffix = "" if enc == "float32" else f"__{encoding_suffix(enc)}"
        # Beside the scratch trunk's cells, never resumed as them.
        suffix += self.profile.backbone_suffix
        return f"{self.setting.name}__{self.method.name}__s{self.seed}{suffix}"


def eval_horizons(
    setting: Setting, data: dict[str, list[Episode]], factor: float | None
) -> dict[str, int]:
    """Per family: rollouts end (as failures) after ``factor`` x its longest demonstration.

    Failed rollouts run to the horizon and dominate evaluation time, while successful ones
    finish near the expert's length, so a multiple of the longest demo keeps the success
    rates and cuts the cost. None: the task's own horizon for every family.
    """
    if factor is None:
        return {}
    if not factor >= 1.0:
        raise ValueError(f"eval_horizon_factor must be >= 1 (or None), got {factor!r}")
    out: dict[str, int] = {}
    for fam in setting.families:
        lengths = [
            len(e)
            for eps in data.values()
            for e in eps
            if e.task == fam.task and e.variation == fam.variation
        ]
        if lengths:
            out[fam.name] = int(math.ceil(factor * max(lengths)))
    return out


def run_cell(
    spec: CellSpec,
    cache: DemoCache,
    progress: Callable[[str], None] | None = None,
    encoder_store: EncoderStageStore | None = None,
) -> dict[str, Any]:
    """Run one (setting, method, seed) federation and return its JSON record. A fleet-encoder
    cell loads its encoder stages from ``encoder_store`` when another cell ran them."""
    import torch

    torch.set_num_threads(1)  # the benchmark runs cells side by side on few cores
    profile, seed = spec.profile, spec.seed
    policy_cfg = profile.policy_config()
    data = cache.robot_data(spec.setting)
    with tempfile.TemporaryDirectory(prefix="fleet_encoder_") as tmp:
        encoder = None
        if policy_cfg.vision_backbone == FLEET:
            # Seeded by the cell's seed, so every method of a seed starts from one encoder.
            enc_cfg = FleetEncoderConfig(**{"seed": seed, **(profile.fleet_encoder or {})})
            encoder = FleetEncoderStage(
                enc_cfg, Path(tmp) / "fleet_encoder.safetensors", store=encoder_store
            )
            policy_cfg = encoder.policy_config(policy_cfg)
        return _run_cell(spec, data, policy_cfg, encoder, progress)


def _run_cell(
    spec: CellSpec,
    data: dict[str, list[Episode]],
    policy_cfg: Any,
    encoder: FleetEncoderStage | None,
    progress: Callable[[str], None] | None,
) -> dict[str, Any]:
    """`run_cell` once its data and policy (and fleet encoder stage, if any) are set up."""
    from fed_ros.core.encodings import roundtrip
    from fed_ros.core.params import flatten
    from fed_ros.core.rounds.config import RoundConfig
    from fed_ros.core.strategies.base import make_strategy
    from fed_ros.learning.trainer import initial_state_dict

    setting, method, profile, seed = spec.setting, spec.method, spec.profile, spec.seed
    enc = profile.model_encoding  # what the robots decode cluster models from
    ids = setting.robot_ids
    groups = [setting.dominant_family(n) for n in range(len(ids))]
    all_eps = [e for rid in ids for e in data[rid]]
    # The fleet server's initial model: placeholder normalisation, which each robot (client)
    # fills from its own demos in round 0.
    theta0_sd = initial_state_dict(policy_cfg, seed=seed)
    theta0 = flatten(theta0_sd)
    evaluator = Evaluator(
        policy_cfg,
        profile.eval_episodes,
        seed=seed,
        max_steps=eval_horizons(setting, data, profile.eval_horizon_factor),
    )
    eval_rounds = sorted(
        {r for r in range(profile.rounds) if (r + 1) % profile.eval_every == 0}
        | {profile.rounds - 1}
    )
    record: dict[str, Any] = {
        "setting": setting.name,
        "method": method.name,
        "seed": seed,
        "profile": profile.to_json(),
        "robots": ids,
        "groups": groups,
        "strategy": method.strategy,
        "robot_mix": {rid: dict(mix) for rid, mix in zip(ids, setting.robots)},
        "rounds": [],
        "evals": [],
    }
    t_start = time.perf_counter()
    cpu_start = time.process_time()
    encoder_clients = make_clients(ids, policy_cfg, seed) if encoder is not None else {}
    record["encoder_rounds"] = []

    def refresh_encoder(r: int) -> None:
        # Every robot trains the shared encoder, whatever the method: it is fleet-wide.
        if encoder is not None and encoder.due(r):
            record["encoder_rounds"].extend(encoder.run(encoder_clients, data))

    try:
        if method.strategy == "centralized":
            sd = theta0_sd
            (central,) = make_clients(["centralized"], policy_cfg, seed).values()
            # Same total optimiser steps as the fleet performs per round.
            config = RoundConfig(local_steps=profile.local_steps * len(ids), lr=profile.lr)
            for r in range(profile.rounds):
                refresh_encoder(r)
                res = central.fit(sd, config, all_eps, r)
                sd = res.params
                record["rounds"].append({"round": r, "loss_bc": res.metrics.get("loss_bc")})
                if r in eval_rounds:
                    ev = evaluator.evaluate_fleet(setting, {rid: sd for rid in ids})
                    record["evals"].append({"round": r, **ev})
                if progress:
                    progress(f"{spec.key} r{r}")
        else:
            # The profile's training schedule is a strategy setting, as in a fleet file.
            strategy = make_strategy(
                method.strategy,
                **method.strategy_settings(setting.num_clusters),
                lr=profile.lr,
                local_steps=profile.local_steps,
            )
            strategy.initialize(theta0_sd, ids)
            clients = make_clients(ids, policy_cfg, seed)
            feedback: dict[str, Any] = {}  # topk: each robot's residual, across rounds
            for r in range(profile.rounds):
                refresh_encoder(r)
                row: dict[str, Any] = {"round": r}
                t_train = time.perf_counter()
                run = federation_round(strategy, clients, data, r, profile.encoding, feedback)
                row["train_s"] = time.perf_counter() - t_train
                result = run.result
                row.update({k: v for k, v in run.extra.items() if k != "aggregate_cpu_s"})
                row["aggregate_cpu_s"] = run.extra["aggregate_cpu_s"]
                # CPU seconds spent deciding clusters this round (client-side IFCA evaluation,
                # descriptor computation, and the server's aggregation including clustering).
                row["cluster_cpu_s"] = run.cluster_cpu_s
                vecs = [flatten(u.params) - theta0 for u in run.updates]
                deltas = [flatten(u.params) - flatten(run.starts[u.robot_id]) for u in run.updates]
                acc, step = cosine_matrix(np.stack(vecs)), cosine_matrix(np.stack(deltas))
                row["acc_intra"], row["acc_inter"] = intra_inter(acc, groups)
                row["step_intra"], row["step_inter"] = intra_inter(step, groups)
                row["loss_bc"] = float(
                    np.nanmean([u.metrics.get("loss_bc", math.nan) for u in run.updates])
                )
                row["assignments"] = {
                    k: [[int(c), float(w)] for c, w in v] for k, v in result.assignments.items()
                }
                row["clusters"] = hard_clusters(row["assignments"], ids)
                row["coassign"] = coassignment(row["assignments"], ids).tolist()
                row["num_clusters"] = len(result.cluster_models)
                row["diagnostics"] = _jsonable(
                    {k: v for k, v in result.diagnostics.items() if k not in ("similarity",)}
                )
                record["rounds"].append(row)
                if r in eval_rounds:
                    # Each robot evaluates the model it decoded from the wire.
                    models = {rid: roundtrip(strategy.model_for(rid), enc) for rid in ids}
                    ev = evaluator.evaluate_fleet(setting, models)
                    record["evals"].append({"round": r, **ev})
                if progress:
                    progress(f"{spec.key} r{r}")
    finally:
        evaluator.close()
    record["eval_s"] = evaluator.seconds
    record["eval_cpu_s"] = evaluator.cpu_seconds
    record["eval_max_steps"] = evaluator.max_steps
    record["rollouts"] = [list(r) for r in evaluator.rollouts]
    record["wall_s"] = time.perf_counter() - t_start
    record["cpu_s"] = time.process_time() - cpu_start
    final = record["evals"][-1] if record["evals"] else {}
    record["final"] = {"mean": final.get("mean"), "per_family": final.get("per_family", {})}
    return record


def cell_path(out_dir: Path, spec: CellSpec) -> Path:
    """Where a cell's JSON lives."""
    return out_dir / "cells" / f"{spec.key}.json"


def save_json(path: Path, obj: Any) -> None:
    """Atomic JSON write (temp + rename) so an interrupted run never leaves half a cell."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_jsonable(obj), indent=1))
    os.replace(tmp, path)
