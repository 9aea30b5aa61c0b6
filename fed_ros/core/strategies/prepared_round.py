"""A round's updates made ready for averaging: validated once, sorted, stacked into one array.

Every strategy starts ``aggregate_round`` the same way: refuse an empty round, anything that
is not a ``ClientUpdate``, a robot answering twice, a base model newer than the round and
tensors that do not match the fleet's manifest, then stack the parameters into one contiguous
(K, P) array in robot-id order. That gate and its result stand alone because they depend only
on the updates and the manifest, not on a strategy's clusters; the averaging that consumes a
:class:`PreparedRound` is ``Strategy._average_groups`` (:mod:`fed_ros.core.strategies.base`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fed_ros.core.params import Manifest, check_manifest, stack_state_dicts
from fed_ros.core.strategies.aggregate import sample_weights
from fed_ros.core.strategies.types import ClientUpdate


@dataclass
class PreparedRound:
    """Validated updates of one round, stacked once into a contiguous (K, P) array."""

    robot_ids: list[str]
    stacked: np.ndarray
    num_samples: np.ndarray
    updates: list[ClientUpdate]


def prepare_round(
    strategy_name: str, round_idx: int, updates: Sequence[ClientUpdate], manifest: Manifest
) -> PreparedRound:
    """Validate (manifest, sample counts, ids, rounds) and stack the updates once.

    ``strategy_name`` only names the strategy in the message of an empty round.
    """
    if not updates:
        raise ValueError(f"{strategy_name}: round {round_idx} has no updates")
    seen: set[str] = set()
    for u in updates:
        if not isinstance(u, ClientUpdate):
            raise ValueError(f"expected ClientUpdate, got {type(u).__name__}")
        if u.robot_id in seen:
            raise ValueError(f"duplicate update from robot {u.robot_id!r}")
        seen.add(u.robot_id)
        if u.base_round > round_idx:
            raise ValueError(
                f"update of {u.robot_id!r} has base_round {u.base_round} > round {round_idx}"
            )
        try:
            check_manifest(u.params, manifest)
        except ValueError as exc:
            raise ValueError(f"update of {u.robot_id!r}: {exc}") from None
    # Robot-id order, not arrival order: the float arithmetic (and so every bit of the
    # result) is then independent of which robot's update arrived first.
    updates = sorted(updates, key=lambda u: u.robot_id)
    ids = [u.robot_id for u in updates]
    n = np.array([u.num_samples for u in updates], dtype=np.float64)
    sample_weights(n, ids)  # raises on all-zero
    stacked = stack_state_dicts([u.params for u in updates], manifest)
    return PreparedRound(ids, stacked, n, list(updates))
