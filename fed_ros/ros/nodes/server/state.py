"""The fleet server's round state on disk: opened at start-up, resumed from the last commit.

From the server parameters: the strategy, the initial model (and its manifest, the shape
every update must have), the :class:`ModelStore` and audit log in ``state_dir``, and the
:class:`RoundCoordinator` over them, resumed from the last committed round (the roster from
``roster.json``). A server killed at any point restarts here with the same models. It stands
apart from the node so that what survives a restart, and how it is found again, is one
function; the node only wires the result to topics.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fed_ros.core.checks.audit_log import AuditLog
from fed_ros.core.params import manifest_of
from fed_ros.core.rounds import faults
from fed_ros.core.rounds.coordinator import RoundCoordinator
from fed_ros.core.rounds.store import ModelStore
from fed_ros.core.strategies.base import make_strategy
from fed_ros.ros.configuration.fleet_params import ServerParams, policy_architecture
from fed_ros.ros.nodes.server.config import liveness_settings, round_settings, strategy_settings


@dataclass(frozen=True)
class RoundState:
    """What :func:`open_round_state` built; ``resumed``: a committed round was found."""

    strategy: Any
    manifest: Any  # of the initial model: every update must match it
    store: ModelStore
    audit: AuditLog
    coord: RoundCoordinator
    resumed: bool

    def resume_note(self) -> str:
        """Where the server starts from, for its start-up log line."""
        return (
            f"resumed after committed round {self.coord.round_idx - 1}"
            if self.resumed
            else "no committed round: starting from the initial model"
        )


def open_round_state(
    params: ServerParams,
    allowed_keys: dict[str, bytes] | None,
    clock: Callable[[], float],
    backbone_weights: str | None = None,
) -> RoundState:
    """Build the strategy, store, audit log and coordinator, and resume the last commit
    (``backbone_weights``: the fleet encoder's file when the server runs its stage)."""
    from fed_ros.core.rounds.roster import Roster
    from fed_ros.learning.configuration_policy import PolicyConfig
    from fed_ros.learning.trainer import initial_state_dict

    p = params
    strategy = make_strategy(p.algorithm, **strategy_settings(p.algorithm, p))
    # The robots' architecture (backbone included): their updates must match this manifest.
    initial = initial_state_dict(
        PolicyConfig(**policy_architecture(p, backbone_weights)), seed=p.seed
    )
    manifest = manifest_of(initial)
    state_dir = Path(p.state_dir)
    store = ModelStore(state_dir, _crash_point=faults.store_hook(lambda: coord.round_idx))  # tests
    audit = AuditLog(state_dir / "audit.jsonl")
    try:
        coord = RoundCoordinator(
            strategy,
            store,
            round_settings(p),
            initial,
            Roster(allowed_keys=allowed_keys, max_samples=p.max_samples),
            clock=clock,
            roster_file=Path(p.state_dir) / "roster.json",
            liveness=liveness_settings(p),
        )
        resumed = coord.resume()
    except BaseException:
        audit.close()  # the node never holds it, so its destroy_node cannot close it
        raise
    return RoundState(strategy, manifest, store, audit, coord, resumed)
