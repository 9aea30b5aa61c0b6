"""`fed-ros bench robustness`: one malicious robot of five under each attack, with and without
robust rules.

Two in-process settings, both measured (nothing here is a stated number):

* ``updates`` - synthetic cluster updates: honest robots send reference + shared direction + noise
  (P parameters); the attacker applies each model attack to its own honest update.
* ``linear-bc`` - real demonstrations (``Episode`` objects from a linear expert on the 32-D object
  state) and real local training of a linear policy by gradient descent from the cluster model;
  the attacker poisons its update (model attacks) or its data (label-flip: negated / shuffled
  actions). Besides the model distance it reports the aggregate policy's action MSE on held-out
  honest demonstrations (the task-quality proxy; closed-loop success needs the MuJoCo sweep of
  `fed-ros bench federation`).

Every update first passes `validate_update` (as on the server), so NaN injection is rejected
there; the table shows what each rule would do with and without that check. Distances are
relative: ||aggregate(attacked) - aggregate_mean(no attack)|| / ||aggregate_mean(no attack) -
reference||. The clip rule's bound (one client moves the aggregate by at most clip/n) is printed
beside it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from fed_ros.core.checks.sender_checks import ValidationContext
from fed_ros.core.checks.update_checks import UpdateEnvelope, validate_update
from fed_ros.core.security.attacks import DATA_ATTACKS, MODEL_ATTACKS, attack_vector, label_flip
from fed_ros.core.data.episode import ACTION_DIM, Episode, OBJECT_STATE, OBJECT_STATE_DIM
from fed_ros.core.params import TensorSpec
from fed_ros.core.strategies.robust import aggregate_robust

RULES = ("mean", "clip", "median", "trimmed_mean", "multi_krum")
RULE_SETTINGS = {
    "trimmed_mean": {"trim": 0.2},
    "multi_krum": {"f": 1},
}  # trim 0.2 of 5 cuts one each end


@dataclass
class AttackRow:
    """One line of the attack table: per rule, relative distance (None = the rule refused the
    input)."""

    setting: str
    attack: str
    validated: bool  # whether the attacker's update passed validation
    distance: dict[str, float | None]
    action_mse: dict[str, float | None]
    clip_bound: (
        float  # 2 clip/n relative to the no-attack step norm: the most one robot can move it
    )
    clip_shift: float | None  # measured ||clip(attacked) - clip(no attack)||, same units


def aggregate_all(
    stacked: np.ndarray, reference: np.ndarray, clip_norm: float
) -> dict[str, np.ndarray | None]:
    """Aggregate (K, P) updates with every rule; None where a rule refuses the input."""
    weights = np.ones(stacked.shape[0])
    out = {}
    for rule in RULES:
        kw = dict(RULE_SETTINGS.get(rule, {}))
        if rule == "clip":
            kw = {"clip_norm": clip_norm, "reference": reference}
        try:
            out[rule] = aggregate_robust(stacked, weights, rule, **kw)
        except ValueError:  # NaN input, or too few updates for Krum (n < 2f + 3)
            out[rule] = None
    return out


def _validated(update: np.ndarray, robot_id: str, manifest: tuple[TensorSpec, ...]) -> bool:
    """Run the server's validation on one flat update (auth off: this measures content checks)."""
    ctx = ValidationContext(current_round=1, expected_manifest=manifest)
    env = UpdateEnvelope(
        robot_id=robot_id,
        round_idx=1,
        base_round=0,
        num_samples=100,
        manifest=manifest,
        total_bytes=update.nbytes,
        payload_sha256="0" * 64,
    )
    return validate_update(env, {manifest[0].name: update}, ctx).accepted


def attack_table(
    honest: np.ndarray,
    reference: np.ndarray,
    attacked: Callable[[str], np.ndarray],
    attacks: Sequence[str],
    setting: str,
    quality: Callable[[np.ndarray], float] | None = None,
    clip_factor: float = 1.0,
) -> list[AttackRow]:
    """Rows for one setting: `honest` (n, P) with the attacker at row 0; `attacked(attack)` its
    poisoned row."""
    n = honest.shape[0]
    manifest = (TensorSpec("params", (honest.shape[1],)),)
    baseline = aggregate_robust(honest, np.ones(n), "mean")
    step = float(np.linalg.norm(baseline.astype(np.float64) - reference)) or 1.0
    # Clip at the median honest step norm: honest robots are (mostly) untouched, outliers are cut.
    clip_norm = clip_factor * float(
        np.median(np.linalg.norm(honest.astype(np.float64) - reference, axis=1))
    )
    clip_clean = aggregate_robust(
        honest, np.ones(n), "clip", clip_norm=clip_norm, reference=reference
    )
    rows = []
    for attack in attacks:
        poisoned = attacked(attack)
        ok = _validated(poisoned, "robot_0", manifest)
        # The server drops rejected updates; the others are aggregated as usual.
        stacked = np.concatenate([poisoned[None], honest[1:]]) if ok else honest[1:]
        aggs = aggregate_all(np.ascontiguousarray(stacked, np.float32), reference, clip_norm)
        dist = {r: _distance(a, baseline, step) for r, a in aggs.items()}
        # What a server without validation computes with plain FedAvg (NaN poisons every weight).
        stacked_raw = np.concatenate([poisoned[None], honest[1:]]).astype(np.float64)
        dist["mean_unvalidated"] = float(np.linalg.norm(stacked_raw.mean(axis=0) - baseline)) / step
        mse = (
            {r: (None if a is None else quality(a)) for r, a in aggs.items()}
            if quality is not None
            else {}
        )
        # B1 is about the attacker's own row: compare against the clip rule with its honest row.
        clip_shift = _distance(aggs["clip"], clip_clean, step) if ok else None
        rows.append(AttackRow(setting, attack, ok, dist, mse, 2 * clip_norm / n / step, clip_shift))
    return rows


def _distance(agg: np.ndarray | None, baseline: np.ndarray, step: float) -> float | None:
    return None if agg is None else float(np.linalg.norm(agg.astype(np.float64) - baseline)) / step


# -------------------------------------------------------------------- setting 1: synthetic updates


def synthetic_updates(
    n: int, dim: int, seed: int, noise: float = 0.5
) -> tuple[np.ndarray, np.ndarray]:
    """(honest (n, P), reference (P,)): reference + shared unit-RMS direction + per-robot noise."""
    rng = np.random.default_rng(seed)
    reference = rng.normal(0, 1, dim).astype(np.float32)
    direction = rng.normal(0, 0.01, dim)
    honest = reference + direction + rng.normal(0, 0.01 * noise, (n, dim))
    return honest.astype(np.float32), reference


# -------------------------------------------------------------------- setting 2: linear BC on demos


def linear_expert_demos(
    weights: np.ndarray, num_episodes: int, steps: int, seed: int, robot_id: str = ""
) -> list[Episode]:
    """Demonstrations of the expert a = tanh(W s) + noise on random 32-D object states."""
    rng = np.random.default_rng(seed)
    out = []
    for e in range(num_episodes):
        states = rng.normal(0, 1, (steps, OBJECT_STATE_DIM)).astype(np.float32)
        actions = np.tanh(states @ weights.T) + rng.normal(0, 0.05, (steps, ACTION_DIM))
        out.append(
            Episode(
                task="lift",
                instruction="lift the cube",
                observations={OBJECT_STATE: states},
                actions=np.clip(actions, -1, 1).astype(np.float32),
                robot_id=robot_id,
                metadata={"episode": str(e)},
            )
        )
    return out


def train_linear_bc(
    start: np.ndarray, episodes: Sequence[Episode], epochs: int = 20, lr: float = 0.05
) -> np.ndarray:
    """Local training of a linear policy a = W s (flat W, ACTION_DIM x 32) by full-batch gradient
    descent."""
    states = np.concatenate([ep.observations[OBJECT_STATE] for ep in episodes]).astype(np.float64)
    actions = np.concatenate([ep.actions for ep in episodes]).astype(np.float64)
    w = start.reshape(ACTION_DIM, OBJECT_STATE_DIM).astype(np.float64).copy()
    for _ in range(epochs):
        grad = (states @ w.T - actions).T @ states / len(states)
        w -= lr * grad
    return w.reshape(-1).astype(np.float32)


def action_mse(flat_w: np.ndarray, episodes: Sequence[Episode]) -> float:
    """Mean squared action error of the linear policy on demonstrations (NaN stays NaN)."""
    states = np.concatenate([ep.observations[OBJECT_STATE] for ep in episodes]).astype(np.float64)
    actions = np.concatenate([ep.actions for ep in episodes]).astype(np.float64)
    w = flat_w.reshape(ACTION_DIM, OBJECT_STATE_DIM).astype(np.float64)
    return float(np.mean((states @ w.T - actions) ** 2))


def linear_bc_setting(
    n: int, seed: int, episodes: int, steps: int
) -> tuple[np.ndarray, np.ndarray, Callable[[str], np.ndarray], Callable[[np.ndarray], float]]:
    """Honest trained updates, reference, attacker factory and quality metric for the linear-BC
    setting."""
    rng = np.random.default_rng(seed)
    expert = rng.normal(0, 0.3, (ACTION_DIM, OBJECT_STATE_DIM))
    reference = np.zeros(
        ACTION_DIM * OBJECT_STATE_DIM, np.float32
    )  # the cluster model of this round
    demos = [
        linear_expert_demos(expert, episodes, steps, seed + 1 + i, f"robot_{i}") for i in range(n)
    ]
    held_out = linear_expert_demos(expert, 4, steps, seed + 1000)
    honest = np.stack([train_linear_bc(reference, d) for d in demos])

    def attacked(attack: str) -> np.ndarray:
        if attack in DATA_ATTACKS:
            mode = attack.removeprefix("label_flip_")
            return train_linear_bc(reference, label_flip(demos[0], mode=mode, seed=seed))
        return attack_vector(honest[0], reference, attack, seed=seed)

    return honest, reference, attacked, lambda w: action_mse(w, held_out)


# -------------------------------------------------------------------- output


def _fmt(x: float | None) -> str:
    if x is None:
        return "refused"
    if not np.isfinite(x):
        return "nan" if np.isnan(x) else "inf"
    return f"{x:.3f}" if x < 1000 else f"{x:.2e}"


def format_table(rows: Sequence[AttackRow]) -> str:
    """Markdown table: relative distance to the no-attack FedAvg aggregate per rule."""
    head = [
        "setting",
        "attack",
        "passes validation",
        "FedAvg no validation",
        *RULES,
        "clip shift",
        "bound 2c/n",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [
            r.setting,
            r.attack,
            "yes" if r.validated else "rejected",
            _fmt(r.distance["mean_unvalidated"]),
            *(_fmt(r.distance[rule]) for rule in RULES),
            _fmt(r.clip_shift) if r.clip_shift is not None else "-",
            _fmt(r.clip_bound),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    if any(r.action_mse for r in rows):
        lines += [
            "",
            "Held-out action MSE of the aggregate policy (linear-bc):",
            "",
            "| attack | " + " | ".join(RULES) + " |",
            "|" + "---|" * (len(RULES) + 1),
        ]
        for r in rows:
            if r.action_mse:
                lines.append(
                    f"| {r.attack} | " + " | ".join(_fmt(r.action_mse[k]) for k in RULES) + " |"
                )
    return "\n".join(lines)


def run(
    quick: bool = False, seed: int = 0, clients: int = 5, dim: int | None = None
) -> list[AttackRow]:
    """Both settings; returns the rows (the CLI prints them)."""
    if clients < 5:
        raise ValueError(
            f"--clients must be >= 5 (Multi-Krum with f=1 needs n >= 5), got {clients}"
        )
    dim = dim or (20_000 if quick else 1_000_000)
    honest, reference = synthetic_updates(clients, dim, seed)
    rows = attack_table(
        honest,
        reference,
        lambda a: attack_vector(honest[0], reference, a, seed=seed),
        MODEL_ATTACKS,
        f"updates P={dim}",
    )
    h, ref, attacked, quality = linear_bc_setting(
        clients, seed, episodes=4 if quick else 10, steps=50
    )
    rows += attack_table(h, ref, attacked, MODEL_ATTACKS + DATA_ATTACKS, "linear-bc", quality)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `fed-ros bench robustness` (`--protocol`: the protocol-attack table
    instead)."""
    argv = list(argv) if argv is not None else sys.argv[1:]
    if (
        "--protocol" in argv
    ):  # real signed fleet + attacker process (fed_ros/bench/protocol_attacks.py)
        from fed_ros.bench import protocol_attacks

        return protocol_attacks.main([a for a in argv if a != "--protocol"])
    parser = argparse.ArgumentParser(
        prog="fed-ros bench robustness",
        description=__doc__.split("\n")[0],
        epilog="--protocol [--quick] [--out DIR] [--json F]: protocol attacks "
        "against a real signed fleet instead (fed_ros/bench/protocol_attacks.py)",
    )
    parser.add_argument("--quick", action="store_true", help="small models (seconds)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--clients", type=int, default=5, help="robots in the cluster, one malicious"
    )
    parser.add_argument("--dim", type=int, default=None, help="parameters of the synthetic updates")
    parser.add_argument("--json", default=None, help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    try:
        rows = run(args.quick, args.seed, args.clients, args.dim)
    except ValueError as err:
        print(f"fed-ros bench robustness: {err}", file=sys.stderr)
        return 2
    print(
        f"One malicious robot of {args.clients}; entries = ||aggregate - FedAvg(no attack)|| / "
        f"||FedAvg(no attack) - cluster model|| (1.0 = as large as the whole honest step).\n"
    )
    print(format_table(rows))
    print(
        f"\n({time.perf_counter() - t0:.1f} s; rejected updates are dropped before aggregation; "
        "trimmed_mean trims 20%, multi_krum f=1, clip at the median honest step norm c; clip "
        "shift = ||clip(attacked) - clip(no attack)||, at most 2c/n; refused = the rule rejects "
        "the input, e.g. Multi-Krum with n < 2f+3 after a rejection)"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump([r.__dict__ for r in rows], f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
