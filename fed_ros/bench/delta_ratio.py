"""What the ``int8_delta`` ratio to float32 depends on: a size model checked against zlib.

``python -m fed_ros.bench.delta_ratio`` trains two low-dim policies (the fleet's and the
federation benchmark's smaller one) from their initial models on synthetic demonstrations,
encodes each update as a robot does (``trained - start``, blockwise int8, deflated) and compares
the payload with the model (docs/transport.md, "What the int8_delta ratio depends on");
``--policies uniform,gaussian,laplace,t3`` does the same for deltas drawn i.i.d. from those
distributions on the fleet policy's shapes:

    payload ~ 4 B + N H / 8 bytes,   ratio = 4 N / payload ~ 32 / (32 B / N + H)

N values in T tensors, B = sum_t ceil(n_t / 128) block scales (float32, which deflate does not
shrink), H the entropy in bits of the int8 levels (what deflate's Huffman stage gets a level
down to; its LZ77 stage finds almost nothing in quantized noise). Blocks of one large tensor
give B / N = 1/128, so a ratio of 32 / (0.25 + H): 3.88x at H = 8 bits (int8_block, no
deflate), 4.07x for Gaussian deltas (H ~ 7.6: a block's absmax is ~2.7 standard deviations),
more the heavier the tails (a block's largest change sets the step, so most levels crowd near
zero) and the more values did not change at all (a zero block's levels cost almost nothing).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from fed_ros.core.encodings.blockwise import BLOCK, block_count, quantize_blocks
from fed_ros.core.encodings.quantized_delta import payload_nbytes


def _entropy_bits(counts: np.ndarray) -> float:
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log2(p)).sum())


def level_entropies(delta: Mapping[str, np.ndarray]) -> tuple[float, float]:
    """(pooled, per-tensor) order-0 entropy in bits a value of the int8 levels of ``delta``:
    one histogram over every tensor, or each tensor's own (weighted by its size). Deflate's
    Huffman tables adapt to a stretch of the stream, so what it reaches lies between the two."""
    pooled = np.zeros(256, np.int64)
    weighted = 0.0
    total = 0
    for name, value in delta.items():
        _, q = quantize_blocks(np.asarray(value, np.float32).reshape(-1), name)
        counts = np.bincount(q.view(np.uint8), minlength=256)
        pooled += counts
        weighted += q.size * _entropy_bits(counts)
        total += q.size
    return _entropy_bits(pooled), weighted / total


def size_model(delta: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """The terms of the model and the real payload of ``delta`` under int8_delta."""
    sizes = [int(np.asarray(v).size) for v in delta.values()]
    n = sum(sizes)
    blocks = sum(block_count(s, BLOCK) for s in sizes)
    pooled, per_tensor = level_entropies(delta)
    actual = payload_nbytes(dict(delta), "int8_delta")
    flat = np.concatenate([np.asarray(v, np.float32).reshape(-1) for v in delta.values()])
    return {
        "values": n,
        "tensors": len(sizes),
        "small_tensors": sum(s < BLOCK for s in sizes),
        "blocks": blocks,
        "unchanged_fraction": float(np.mean(flat == 0)),
        "entropy_pooled_bits": pooled,
        "entropy_per_tensor_bits": per_tensor,
        # What deflate reached, in the model's terms: bits a level once the scales are paid.
        "entropy_effective_bits": 8 * (actual - 4 * blocks) / n,
        "float32_bytes": 4 * n,
        "payload_bytes": actual,
        "ratio_model_pooled": 4 * n / (4 * blocks + n * pooled / 8),
        "ratio_model_per_tensor": 4 * n / (4 * blocks + n * per_tensor / 8),
        "ratio": 4 * n / actual,
        "kurtosis": _kurtosis(flat),
    }


def _kurtosis(x: np.ndarray) -> float:
    x = x[x != 0]
    if x.size < 2 or float(x.std()) == 0:
        return math.nan
    z = (x - x.mean()) / x.std()
    return float(np.mean(z**4))


def trained_delta(policy: str, steps: int, seed: int = 0) -> dict[str, np.ndarray]:
    """``trained - start`` of ``policy`` (fleet: the robots' low-dim policy at their default
    learning rate; bench: the quick benchmark's smaller one at its rate) after ``steps``
    optimiser steps on synthetic low-dim demonstrations; the start carries their normalisation
    (a later round's start model does), so the delta is what training changed."""
    from fed_ros.bench.federation.settings import PROFILES
    from fed_ros.learning.configuration_policy import PolicyConfig
    from fed_ros.learning.configuration_trainer import TrainerConfig
    from fed_ros.learning.dataset import synthetic_episodes
    from fed_ros.learning.trainer import initial_state_dict, train_local

    if policy not in ("fleet", "bench"):
        raise ValueError(f"policy must be 'fleet' or 'bench', got {policy!r}")
    # Each at its own learning rate: a robot's train_lr default, the quick benchmark's lr.
    quick = PROFILES["quick"]
    cfg, lr = (
        (PolicyConfig(kind="lowdim"), TrainerConfig().lr)
        if policy == "fleet"
        else (quick.policy_config(), quick.lr)
    )
    episodes = synthetic_episodes(8, length=40, seed=seed)
    start = initial_state_dict(cfg, seed=seed, episodes=episodes)
    result = train_local(
        start,
        episodes,
        cfg,
        # Epochs enough for max_steps to be what stops training.
        TrainerConfig(
            epochs=10_000, max_steps=steps, lr=lr, val_fraction=0.0, device="cpu", seed=seed
        ),
    )
    return {k: np.asarray(result.params[k], np.float32) - start[k] for k in start}


# Deltas drawn i.i.d. on the fleet policy's tensor shapes: the model's reference points, from
# flat (every level alike: 8 bits) to heavy-tailed (levels crowd near zero).
DISTRIBUTIONS = {
    "uniform": lambda rng, n: rng.uniform(-1.0, 1.0, n),
    "gaussian": lambda rng, n: rng.standard_normal(n),
    "laplace": lambda rng, n: rng.laplace(size=n),
    "t3": lambda rng, n: rng.standard_t(3, n),
}


def drawn_delta(distribution: str, seed: int = 0) -> dict[str, np.ndarray]:
    """A delta of the fleet policy's shapes with i.i.d. values of ``distribution`` (x 1e-3)."""
    from fed_ros.learning.configuration_policy import PolicyConfig
    from fed_ros.learning.trainer import initial_state_dict

    if distribution not in DISTRIBUTIONS:
        raise ValueError(f"distribution must be one of {list(DISTRIBUTIONS)}, got {distribution!r}")
    rng = np.random.default_rng(seed)
    start = initial_state_dict(PolicyConfig(kind="lowdim"), seed=seed)
    return {
        k: (1e-3 * DISTRIBUTIONS[distribution](rng, v.size)).astype(np.float32).reshape(v.shape)
        for k, v in start.items()
    }


def main(argv: list[str] | None = None) -> int:
    """Print the size model against zlib for each policy and step count; returns 0."""
    parser = argparse.ArgumentParser(prog="python -m fed_ros.bench.delta_ratio")
    parser.add_argument(
        "--policies",
        default="fleet,bench",
        help=f"comma list of fleet, bench (trained) and drawn deltas {list(DISTRIBUTIONS)}",
    )
    parser.add_argument("--steps", default="50,200", help="comma list of local step counts")
    parser.add_argument("--json", default="")
    args = parser.parse_args(argv)
    try:
        steps = [int(s) for s in args.steps.split(",") if s.strip()]
    except ValueError:
        raise SystemExit(f"--steps must be a comma list of ints, got {args.steps!r}") from None
    if not steps or min(steps) < 1:
        raise SystemExit(f"--steps must be ints >= 1, got {args.steps!r}")
    rows = []
    for policy in [p.strip() for p in args.policies.split(",") if p.strip()]:
        if policy in DISTRIBUTIONS:
            row = {"policy": policy, "steps": 0, **size_model(drawn_delta(policy))}
            rows.append(row)
            print(json.dumps(row), flush=True)
            continue
        for n_steps in steps:
            row = {"policy": policy, "steps": n_steps, **size_model(trained_delta(policy, n_steps))}
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(
        f"\n{'policy':<7} {'steps':>5} {'values':>8} {'tensors':>7} {'<128':>5} {'B/N':>7} "
        f"{'zero':>5} {'kurt':>5} {'H pool':>6} {'H tens':>6} {'H eff':>6} {'model x':>11} "
        f"{'zlib x':>7} {'payload B':>10}"
    )
    for r in rows:
        model = f"{r['ratio_model_pooled']:.2f}-{r['ratio_model_per_tensor']:.2f}"
        print(
            f"{r['policy']:<7} {r['steps']:>5} {r['values']:>8} {r['tensors']:>7} "
            f"{r['small_tensors']:>5} {r['blocks'] / r['values']:>7.4f} "
            f"{r['unchanged_fraction']:>5.2f} {r['kurtosis']:>5.1f} "
            f"{r['entropy_pooled_bits']:>6.2f} {r['entropy_per_tensor_bits']:>6.2f} "
            f"{r['entropy_effective_bits']:>6.2f} {model:>11} {r['ratio']:>7.2f} "
            f"{r['payload_bytes']:>10}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
