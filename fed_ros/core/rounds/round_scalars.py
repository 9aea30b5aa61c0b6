"""A closed round as tracking scalars (tag -> number), what the server writes to TensorBoard.

Tags group by what they describe, so TensorBoard shows one panel per group: ``round/`` (updates
received, accepted, rejected, completed, aggregation seconds, update bytes), ``clusters/`` (how
many, members, how far each model moved, the members' update similarity), ``robots/<id>/``
(accepted, losses, success, interventions), ``success/`` (the mean over robots that evaluated)
and ``strategy/`` (the strategy's diagnostics). NaN (not measured) is left to the tracker to
skip.
"""

from __future__ import annotations

import math

from fed_ros.core.rounds.report import RoundOutcome


def outcome_scalars(outcome: RoundOutcome, update_bytes: int | None = None) -> dict[str, float]:
    """The scalars of one round's outcome (``update_bytes``: accepted update payload bytes)."""
    out: dict[str, float] = {
        "round/completed": float(outcome.completed),
        "round/updates_received": float(outcome.updates_received),
        "round/updates_accepted": float(outcome.updates_accepted),
        "round/updates_rejected": float(outcome.updates_rejected),
        "round/aggregation_s": float(outcome.aggregation_seconds),
        "clusters/count": float(len(outcome.clusters)),
    }
    if update_bytes is not None:
        out["round/update_bytes"] = float(update_bytes)
    for cid, members in outcome.clusters.items():
        out[f"clusters/{cid}/members"] = float(len(members))
    for cid, norm in outcome.cluster_update_norms.items():
        out[f"clusters/{cid}/update_norm"] = float(norm)
    for cid, sim in outcome.cluster_intra_similarity.items():
        out[f"clusters/{cid}/intra_similarity"] = float(sim)
    successes = []
    for robot in outcome.robots:
        key = f"robots/{robot.robot_id}"
        out[f"{key}/accepted"] = float(robot.accepted)
        out[f"{key}/train_loss"] = float(robot.train_loss)
        out[f"{key}/val_loss"] = float(robot.val_loss)
        out[f"{key}/success"] = float(robot.success_rate)
        out[f"{key}/interventions_per_episode"] = float(robot.interventions_per_episode)
        if not math.isnan(robot.success_rate):
            successes.append(float(robot.success_rate))
    if successes:
        out["success/mean"] = sum(successes) / len(successes)
    for name, value in outcome.diagnostics.items():
        out[f"strategy/{name}"] = float(value)
    return out
