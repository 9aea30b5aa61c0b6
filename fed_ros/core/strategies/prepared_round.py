"""A round's updates made ready for averaging: validated once, sorted, stacked only on request.

Every strategy starts ``aggregate_round`` the same way: refuse an empty round, anything that
is not a ``ClientUpdate``, a robot answering twice, a base model newer than the round and
tensors that do not match the fleet's manifest, then sort the updates into robot-id order.
The streamed path (the default) leaves each update where it is and reads it block by block
(:mod:`fed_ros.core.strategies.streamed`); the stacked path (``stack=True``, the reference
the streamed one is tested against) copies them into one contiguous (K, P) array. That gate
and its result stand alone because they depend only on the updates and the manifest, not on
a strategy's clusters; the averaging that consumes a :class:`PreparedRound` is
``Strategy._average_groups`` (:mod:`fed_ros.core.strategies.base`).
"""

from __future__ import annotations

from typing import Any

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from fed_ros.core.params import Manifest, StateDict, check_manifest, flatten, stack_state_dicts
from fed_ros.core.strategies.aggregate import first_nonfinite_row, sample_weights
from fed_ros.core.strategies.streamed import first_nonfinite
from fed_ros.core.strategies.types import ClientUpdate


@dataclass
class PreparedRound:
    """Validated updates of one round in robot-id order; ``stacked`` (K, P) on the stacked path."""

    robot_ids: list[str]
    stacked: NDArray[Any] | None
    num_samples: NDArray[Any]
    updates: list[ClientUpdate]
    manifest: Manifest = ()

    @property
    def params(self) -> list[StateDict]:
        """Every update's state dict, in robot-id order."""
        return [u.params for u in self.updates]

    def row(self, k: int) -> NDArray[Any]:
        """Update k as a flat float32 vector (a view on the stacked path, else a copy)."""
        if self.stacked is not None:
            update_row: NDArray[Any] = self.stacked[k]
            return update_row
        return flatten(self.updates[k].params)

    def first_nonfinite(self, members: Sequence[int] | None = None) -> int:
        """Position (in ``members``, default all) of the first update holding NaN/Inf, or -1."""
        idx = range(len(self.updates)) if members is None else list(members)
        if self.stacked is not None:
            return first_nonfinite_row(self.stacked[idx])
        return first_nonfinite([self.updates[k].params for k in idx])


def prepare_round(
    strategy_name: str,
    round_idx: int,
    updates: Sequence[ClientUpdate],
    manifest: Manifest,
    stack: bool = False,
) -> PreparedRound:
    """Validate (manifest, sample counts, ids, rounds); stack the updates when ``stack``.

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
    stacked = stack_state_dicts([u.params for u in updates], manifest) if stack else None
    return PreparedRound(ids, stacked, n, list(updates), tuple(manifest))
