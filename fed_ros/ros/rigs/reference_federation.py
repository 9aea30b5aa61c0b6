"""What a scripted federation must end with: its reference result and what the server committed.

:func:`reference_models` computes the final cluster models of the same FedAvg federation the
scripted honest robots of :mod:`fed_ros.ros.rigs.scripted` run, in-process (no DDS, no
attacker); :func:`committed_models` reads the server's last committed round from its store. A
suite or benchmark compares the two byte for byte, so the pair stands apart from the fleet's
machinery (keys, server argv, scripted robots) it checks.
"""

from __future__ import annotations

from pathlib import Path

from fed_ros.ros.rigs.scripted import ROBOTS, honest_update


def reference_models(initial: dict, robots=ROBOTS, rounds: int = 3) -> dict[int, dict[str, bytes]]:
    """Final cluster models of the same FedAvg federation computed in-process (no DDS, no
    attacker)."""
    from fed_ros.core.strategies.base import make_strategy
    from fed_ros.core.strategies.types import ClientUpdate

    strategy = make_strategy("fedavg")
    strategy.initialize(initial, list(robots))
    result = None
    for r in range(rounds):
        strategy.configure_round(r, list(robots))
        ups = [
            ClientUpdate(
                robot_id=rid,
                params=honest_update(initial, r, k),
                num_samples=100 + 10 * k,
                base_round=r,
            )
            for k, rid in enumerate(robots)
        ]
        result = strategy.aggregate_round(r, ups, {})
    return {c: {n: a.tobytes() for n, a in m.items()} for c, m in result.cluster_models.items()}


def committed_models(state_dir: Path) -> tuple[int, dict[int, dict[str, bytes]]]:
    """(round, cluster models as bytes) of the server's last committed round."""
    from fed_ros.core.rounds.store import ModelStore

    snap = ModelStore(state_dir).load_latest()
    assert snap is not None, f"nothing committed in {state_dir}"
    return snap.round_idx, {
        c: {n: a.tobytes() for n, a in m.items()} for c, m in snap.cluster_models.items()
    }
