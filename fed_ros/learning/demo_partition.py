"""Split a recorded demonstration set across robots (non-IID emulation).

Reads a directory of Episode ``.npz`` files, groups episodes by task, variation, task and
variation, or penultimate-layer embedding clusters of a trained policy, draws each robot's
group mixture from Dir(alpha * p_hat) (or skews only the dataset sizes with ``--by
quantity``), prints the per-robot composition table and writes one JSON manifest per robot
(``robot_<i>.json``: the episode files it trains on) plus ``partition.json``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Sequence

import numpy as np

from fed_ros.core.data import partition as P
from fed_ros.core.clustering import kmeans as KM
from fed_ros.core.data.episode import Episode

GROUPINGS = ("task", "variation", "task+variation", "embedding", "quantity")


def read_episode_meta(path: str | Path) -> dict:
    """Task/variation/success of an episode file without loading its observation arrays."""
    with np.load(path, allow_pickle=False) as data:
        if "meta_json" not in data.files:
            raise ValueError(f"{path}: not a fed_ros Episode file (no meta_json)")
        return json.loads(bytes(data["meta_json"]).decode())


def list_episodes(
    directory: str | Path, include_failed: bool = False
) -> tuple[list[Path], list[dict]]:
    """Episode files (sorted) and their metadata; failed demos are dropped unless asked."""
    root = Path(directory)
    if not root.is_dir():
        raise ValueError(f"demonstration directory {str(root)!r} does not exist")
    files = sorted(root.rglob("*.npz"))
    paths, metas = [], []
    for f in files:
        meta = read_episode_meta(f)
        if include_failed or bool(meta.get("success", True)):
            paths.append(f)
            metas.append(meta)
    if not paths:
        raise ValueError(f"no (successful) Episode .npz files under {str(root)!r}")
    return paths, metas


def episode_embeddings(
    paths: Sequence[Path], checkpoint: str | Path, policy_config: str | Path | None = None
) -> np.ndarray:
    """(N, D) per-episode penultimate-layer embeddings (mean over its windows) of a trained
    policy."""
    from fed_ros.learning.configuration_policy import PolicyConfig
    from fed_ros.learning.descriptors import penultimate_embeddings
    from fed_ros.learning.weights import load_checkpoint, read_checkpoint_config

    if not Path(checkpoint).is_file():
        raise ValueError(f"checkpoint {str(checkpoint)!r} not found")
    sd = load_checkpoint(checkpoint)
    cfg: PolicyConfig | None
    if policy_config:
        raw = json.loads(Path(policy_config).read_text())
        cfg = PolicyConfig.from_dict(raw.get("policy", raw))
    else:
        cfg = read_checkpoint_config(checkpoint)
        if cfg is None:
            raise ValueError(
                f"checkpoint {str(checkpoint)!r} has no policy config; pass --policy-config"
            )
    return np.stack(
        [
            np.asarray(penultimate_embeddings(sd, cfg, [Episode.load(p)]), dtype=np.float64).mean(0)
            for p in paths
        ]
    )


def partition_demos(
    demos: str | Path,
    robots: int = 4,
    by: str = "task",
    alpha: float = 0.5,
    beta: float = 0.5,
    k: int = 16,
    checkpoint: str | Path | None = None,
    policy_config: str | Path | None = None,
    seed: int = 0,
    include_failed: bool = False,
    fractions: bool = False,
    out: str | Path | None = None,
) -> int:
    """Partition the Episode files under ``demos`` across ``robots`` robots and print the table.

    Writes the manifests to ``out`` when given; raises ``ValueError`` naming a bad setting.
    """
    if robots < 1:
        raise ValueError(f"--robots must be >= 1, got {robots}")
    if not (alpha > 0):
        raise ValueError(f"--alpha must be > 0 (or inf), got {alpha}")
    paths, metas = list_episodes(demos, include_failed=include_failed)
    root = Path(demos)
    names = [str(p.relative_to(root)) for p in paths]
    extra: dict = {}
    if by == "quantity":
        part = P.quantity_skew_split(len(paths), robots, beta, seed=seed)
    elif by == "embedding":
        if not checkpoint:
            raise ValueError("--by embedding needs --checkpoint (a policy trained on the demos)")
        emb = episode_embeddings(paths, checkpoint, policy_config)
        part, km = P.embedding_split(emb, robots, alpha, k=min(k, len(paths)), seed=seed)
        tasks = [m["task"] for m in metas]
        extra = {
            "kmeans_inertia": km.inertia,
            "ari_clusters_vs_task": KM.adjusted_rand_index(km.labels, tasks),
        }
    else:
        key = {
            "task": lambda m: m["task"],
            "variation": lambda m: m.get("variation", "default"),
            "task+variation": lambda m: f"{m['task']}/{m.get('variation', 'default')}",
        }[by]
        part = P.dirichlet_split([key(m) for m in metas], robots, alpha, seed=seed, kind=by)
    robot_ids = [f"robot_{n}" for n in range(robots)]
    alpha_text = "inf" if math.isinf(alpha) else f"{alpha:g}"
    print(
        f"{len(paths)} episodes from {root} -> {robots} robots, by {by}, "
        f"alpha {alpha_text}, seed {seed}"
    )
    print(P.composition_table(part, robot_ids, fractions=fractions))
    for measure, value in extra.items():
        print(f"{measure}: {value:.4f}")
    if out:
        out_dir = Path(out)
        out_dir.mkdir(parents=True, exist_ok=True)
        for n, rid in enumerate(robot_ids):
            (out_dir / f"{rid}.json").write_text(P.partition_manifest(part, n, names))
        summary = (
            part.to_json()
            | {"demos": str(root.resolve()), "items": names, "by": by, "robot_ids": robot_ids}
            | extra
        )
        (out_dir / "partition.json").write_text(json.dumps(summary, indent=1))
        print(f"wrote {len(robot_ids)} manifests to {out_dir}")
    return 0
