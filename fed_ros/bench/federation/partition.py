"""Partition study of `fed-ros bench federation` (``partition``): held-out loss vs Dirichlet alpha.

:func:`run_partition` cuts Lift demos of three variations into fixed-length segments,
splits them across robots by task (variation label) or by k-means clusters of a centrally
trained model's penultimate embeddings, trains FedAvg on each split and compares the
held-out NLL across alpha; :func:`partition_claims` and :func:`partition_section` report it.
Training is the fleet's: each robot is a `RobotClient` and the rounds are
`federation_round` under `FedAvgStrategy`, the benchmark's own round.
"""

from __future__ import annotations

import functools
import json
import math
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from fed_ros.bench.federation import report as R
from fed_ros.bench.federation.demos import DemoCache
from fed_ros.bench.federation.run import save_json
from fed_ros.bench.federation.settings import Profile


def _segments(eps: Sequence[Any], length: int) -> list[Any]:
    """Cut episodes into fixed-length segments (the pool items of the partition study)."""
    from fed_ros.core.data.episode import Episode

    out = []
    for e in eps:
        for s in range(0, len(e) - length + 1, length):
            out.append(
                Episode(
                    task=e.task,
                    instruction=e.instruction,
                    observations={k: v[s : s + length] for k, v in e.observations.items()},
                    actions=e.actions[s : s + length],
                    variation=e.variation,
                    success=True,
                    metadata={"segment": str(s)},
                )
            )
    return out


def segment_embeddings(sd: dict[str, np.ndarray], segs: Sequence[Any], cfg: Any) -> np.ndarray:
    """(N, E) penultimate-layer (action-token) embeddings averaged over each segment's windows."""
    from fed_ros.learning.descriptors import penultimate_embeddings

    return np.stack(
        [
            np.asarray(penultimate_embeddings(sd, cfg, [seg]), dtype=np.float64).mean(0)
            for seg in segs
        ]
    )


def partition_seed(seed: int, round_idx: int, robot: int) -> int:
    """Trainer seed of robot ``robot`` in round ``round_idx`` of a partition federation (kept from
    the study's first runs, so its published numbers stay reproducible; the fleet's is
    `trainer_seed`)."""
    return seed + 97 * round_idx + robot


def fedavg_on_split(
    theta0: dict[str, np.ndarray],
    robot_data: Sequence[Sequence[Any]],
    cfg: Any,
    prof: Profile,
    seed: int,
) -> dict[str, np.ndarray]:
    """FedAvg over the robots of one split (robots without data sit out): the model after the
    study's rounds."""
    from fed_ros.bench.federation.run import BENCH_LOCAL, federation_round
    from fed_ros.core.strategies.fedavg import FedAvgStrategy
    from fed_ros.learning.client import RobotClient

    data, clients = {}, {}
    for n, eps in enumerate(robot_data):
        if len(eps):
            # zero-padded: robot-id order (the aggregation's) is the index order
            rid = f"robot_{n:04d}"
            data[rid] = list(eps)
            clients[rid] = RobotClient(
                rid,
                cfg,
                device="cpu",
                local=BENCH_LOCAL,
                seed_schedule=functools.partial(partition_seed, seed, robot=n),
            )
    strategy = FedAvgStrategy(lr=prof.lr, local_steps=prof.local_steps)
    strategy.initialize(theta0, sorted(data))
    for r in range(prof.partition_rounds):
        federation_round(strategy, clients, data, r)
    return {k: np.array(v) for k, v in strategy.cluster_models()[0].items()}


def run_partition(prof: Profile, out: Path, cache: DemoCache, force: bool) -> dict[str, Any]:
    """Loss vs alpha for task- (variation-label) and embedding-based splits under FedAvg."""
    from fed_ros.bench.federation.run import BENCH_LOCAL
    from fed_ros.core.data import partition as P
    from fed_ros.core.clustering import kmeans as KM
    from fed_ros.core.rounds.config import RoundConfig
    from fed_ros.learning.client import RobotClient
    from fed_ros.learning.dataset import DemoDataset
    from fed_ros.learning.modeling_policy import build_policy
    from fed_ros.learning.trainer import evaluate_nll, initial_state_dict
    from fed_ros.learning.weights import load_state_dict_into

    path = out / "cells" / "partition_alpha.json"
    if path.is_file() and not force:
        return json.loads(path.read_text())
    cfg = prof.policy_config()
    seg_len = 8
    variations = ("default", "small_objects", "big_objects")
    per_var = max(2, int(math.ceil(prof.partition_segments / len(variations) / 5)))
    eps, held = [], []
    for v in variations:
        pool = cache.pool("lift", v, per_var + 2)
        eps += pool[:per_var]
        held += pool[per_var : per_var + 2]
    segs = _segments(eps, seg_len)
    labels = [s.variation for s in segs]
    seed = prof.seeds[0]
    theta0 = initial_state_dict(cfg, seed=seed, episodes=eps)
    t0 = time.perf_counter()
    # The "task-trained" model: one robot trains on every segment (plain BC, 4x a round's steps).
    central_robot = RobotClient(
        "central", cfg, device="cpu", local=BENCH_LOCAL, seed_schedule=lambda r: seed
    )
    central = central_robot.fit(
        theta0, RoundConfig(local_steps=prof.local_steps * 4, lr=prof.lr), segs, 0
    ).params
    emb = segment_embeddings(central, segs, cfg)
    k = min(16, len(segs) // 4)
    km = KM.kmeans(emb, k, seed=seed)
    diag = {
        "k": k,
        "segments": len(segs),
        "segment_len": seg_len,
        "ari_clusters_vs_variation": KM.adjusted_rand_index(km.labels, labels),
        "silhouette_vs_k": KM.silhouette_vs_k(
            emb, [k2 for k2 in (2, 4, 8, 16) if k2 < len(segs) // 2], seed=seed
        ),
        "stability_ari": KM.kmeans_stability(emb, k, seeds=(0, 1, 2)),
        "embedding_s": time.perf_counter() - t0,
    }
    held_data = DemoDataset(held, cfg)
    K = prof.robots
    results: dict[str, dict[str, float]] = {"task": {}, "embedding": {}}
    comps: dict[str, str] = {}
    for kind in ("task", "embedding"):
        for alpha in prof.alphas:
            part = (
                P.task_split(labels, K, alpha, seed=seed)
                if kind == "task"
                else P.dirichlet_split(km.labels, K, alpha, seed=seed, kind="embedding")
            )
            comps[f"{kind}_alpha{alpha:g}"] = P.composition_table(part)
            theta = fedavg_on_split(
                theta0, [[segs[i] for i in part.indices[n]] for n in range(K)], cfg, prof, seed
            )
            model = load_state_dict_into(build_policy(cfg, seed=0), theta)
            results[kind][f"{alpha:g}"] = evaluate_nll(model, held_data)
    rec = {
        "alphas": list(prof.alphas),
        "loss": results,
        "diagnostics": diag,
        "compositions": comps,
        "gap": {
            kind: results[kind][f"{min(prof.alphas):g}"] - results[kind][f"{max(prof.alphas):g}"]
            for kind in results
        },
    }
    save_json(path, rec)
    return rec


def partition_claims(part: dict[str, Any] | None) -> list[str]:
    """Claim line of the partition study: embedding-based splits hurt more than task-based ones."""
    lines: list[str] = []
    if part:
        gap = part["gap"]
        lines.append(
            f"- Loss gap alpha={min(part['alphas']):g} minus alpha={max(part['alphas']):g} "
            f"(held-out NLL, FedAvg): embedding-based {gap['embedding']:+.3f}, task-based "
            f"{gap['task']:+.3f} (claim: embedding gap > task gap: "
            f"{'REPRODUCED' if gap['embedding'] > gap['task'] else 'NOT reproduced'})"
        )
    return lines


def partition_section(out: Path, part: dict[str, Any] | None) -> list[str]:
    """Report section of the partition study (loss vs alpha table, k-means diagnostics, plot)."""
    md: list[str] = []
    if part:
        md += [
            "",
            "## Partitioning: held-out loss vs alpha (FedAvg)",
            "",
            "| split | " + " | ".join(f"alpha={a:g}" for a in part["alphas"]) + " | gap |",
            "|" + "---|" * (len(part["alphas"]) + 2),
        ]
        for kind in ("task", "embedding"):
            md.append(
                f"| {kind}-based | "
                + " | ".join(f"{part['loss'][kind][f'{a:g}']:.3f}" for a in part["alphas"])
                + f" | {part['gap'][kind]:+.3f} |"
            )
        d = part["diagnostics"]
        md += [
            "",
            f"k-means k={d['k']} over {d['segments']} segments of {d['segment_len']} steps; "
            f"ARI(clusters, variation labels) = {d['ari_clusters_vs_variation']:.3f}; "
            f"stability ARI over seeds = {d['stability_ari'][0]:.3f} ± "
            f"{d['stability_ari'][1]:.3f}; silhouette vs k: "
            + ", ".join(f"k={k}: {v:.3f}" for k, v in d["silhouette_vs_k"].items()),
        ]
        png = R.plot_xy(
            out / "partition_loss_vs_alpha.png",
            {
                kind: (part["alphas"], [part["loss"][kind][f"{a:g}"] for a in part["alphas"]])
                for kind in ("task", "embedding")
            },
            "alpha",
            "held-out NLL",
            "FedAvg loss vs Dirichlet alpha",
            logx=True,
        )
        md += ["", f"![loss vs alpha]({png.name})"]
    return md
