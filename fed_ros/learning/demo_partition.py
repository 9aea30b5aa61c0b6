"""`fed-ros partition`: split a recorded demonstration set across robots (non-IID emulation).

Reads a directory of Episode ``.npz`` files, groups episodes by task, variation, task and
variation, or penultimate-layer embedding clusters of a trained policy, draws each robot's
group mixture from Dir(alpha * p_hat) (or skews only the dataset sizes with ``--by
quantity``), prints the per-robot composition table and writes one JSON manifest per robot
(``robot_<i>.json``: the episode files it trains on) plus ``partition.json``.
"""

from __future__ import annotations

import argparse
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


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="fed-ros partition", description=__doc__.splitlines()[0])
    ap.add_argument("demos", help="directory of Episode .npz files (searched recursively)")
    ap.add_argument("--robots", type=int, default=4, help="number of robots K (default 4)")
    ap.add_argument(
        "--by", choices=GROUPINGS, default="task", help="grouping the Dirichlet acts on"
    )
    ap.add_argument(
        "--alpha",
        type=float,
        default=0.5,
        help="Dirichlet concentration (small: skewed; 'inf' for IID)",
    )
    ap.add_argument("--beta", type=float, default=0.5, help="size concentration for --by quantity")
    ap.add_argument("--k", type=int, default=16, help="k-means clusters for --by embedding")
    ap.add_argument("--checkpoint", help="trained policy (.safetensors) for --by embedding")
    ap.add_argument("--policy-config", help="PolicyConfig JSON (default: stored in the checkpoint)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--include-failed", action="store_true", help="also partition failed demos")
    ap.add_argument("--fractions", action="store_true", help="print fractions instead of counts")
    ap.add_argument("--out", help="directory for robot_<i>.json manifests (default: print only)")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `fed-ros partition`; returns the exit code."""
    args = _parser().parse_args(list(argv) if argv is not None else None)
    try:
        return _run(args)
    except ValueError as exc:
        print(f"fed-ros partition: error: {exc}")
        return 2


def _run(args: argparse.Namespace) -> int:
    if args.robots < 1:
        raise ValueError(f"--robots must be >= 1, got {args.robots}")
    if not (args.alpha > 0):
        raise ValueError(f"--alpha must be > 0 (or inf), got {args.alpha}")
    paths, metas = list_episodes(args.demos, include_failed=args.include_failed)
    root = Path(args.demos)
    names = [str(p.relative_to(root)) for p in paths]
    extra: dict = {}
    if args.by == "quantity":
        part = P.quantity_skew_split(len(paths), args.robots, args.beta, seed=args.seed)
    elif args.by == "embedding":
        if not args.checkpoint:
            raise ValueError("--by embedding needs --checkpoint (a policy trained on the demos)")
        emb = episode_embeddings(paths, args.checkpoint, args.policy_config)
        part, km = P.embedding_split(
            emb, args.robots, args.alpha, k=min(args.k, len(paths)), seed=args.seed
        )
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
        }[args.by]
        part = P.dirichlet_split(
            [key(m) for m in metas], args.robots, args.alpha, seed=args.seed, kind=args.by
        )
    robot_ids = [f"robot_{n}" for n in range(args.robots)]
    alpha = "inf" if math.isinf(args.alpha) else f"{args.alpha:g}"
    print(
        f"{len(paths)} episodes from {root} -> {args.robots} robots, by {args.by}, "
        f"alpha {alpha}, seed {args.seed}"
    )
    print(P.composition_table(part, robot_ids, fractions=args.fractions))
    for k, v in extra.items():
        print(f"{k}: {v:.4f}")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        for n, rid in enumerate(robot_ids):
            (out / f"{rid}.json").write_text(P.partition_manifest(part, n, names))
        summary = (
            part.to_json()
            | {"demos": str(root.resolve()), "items": names, "by": args.by, "robot_ids": robot_ids}
            | extra
        )
        (out / "partition.json").write_text(json.dumps(summary, indent=1))
        print(f"wrote {len(robot_ids)} manifests to {out}")
    return 0
