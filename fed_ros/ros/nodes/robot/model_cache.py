"""A robot's received cluster models and the starting model of a round (no ROS).

The robot node's receive path stores each validated cluster model in `entries`
(cluster id -> (round, params, sha256, member robot ids)) under `lock` and notifies;
the worker thread waits here until a round's models have arrived.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from fed_ros.core.strategies.aggregate import weighted_model
from fed_ros.core.checks.decisions import Decision
from fed_ros.core.checks.payload_checks import validate_cluster_model
from fed_ros.ros import shutdown

StateDict = dict[str, np.ndarray]


class ModelCache:
    """Newest model per cluster; waits for a round's models (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.entries: dict[int, tuple[int, StateDict, str, list[str]]] = {}

    def store(
        self,
        cluster_id: int,
        round_idx: int,
        params: StateDict,
        members: list[str],
        *,
        total_bytes: int,
        sha256: str,
        received_sha256: str,
        signature: bytes,
        server_public_key: bytes | None,
        transfer: bytes = b"",
    ) -> Decision:
        """Keep a received cluster model if it is newer, signed when a server key is set, and its
        digest matches.

        (The transfer receiver already checked size, manifest and values.)
        """
        with self.lock:
            held = self.entries.get(cluster_id)
        decision = validate_cluster_model(
            cluster_id=cluster_id,
            round_idx=round_idx,
            params=None,
            expected_manifest=None,
            total_bytes=total_bytes,
            payload_sha256=sha256,
            received_sha256=received_sha256,
            signature=signature,
            server_public_key=server_public_key,
            last_round=held[0] if held else None,
            transfer=transfer,
            members=members,
        )
        if decision:
            with self.lock:
                held = self.entries.get(cluster_id)
                if held is not None and held[0] >= round_idx:
                    return Decision(
                        False, "stale", f"cluster {cluster_id}: round {held[0]} already held"
                    )
                self.entries[cluster_id] = (round_idx, params, sha256, members)
                self.lock.notify_all()
        return decision

    def for_round(
        self, round_idx: int, membership: list[tuple[int, float]], timeout: float = 60.0
    ) -> StateDict:
        """Wait until every cluster model of ``membership`` for ``round_idx`` arrived; their
        mean."""
        needed = [c for c, w in membership if w > 0]
        deadline = time.monotonic() + timeout
        with self.lock:
            while True:
                have = {c: self.entries.get(c) for c in needed}
                stale = [c for c, v in have.items() if v is None or v[0] < round_idx]
                if not stale:
                    break
                shutdown.check()  # Ctrl-C ends the wait (fed_ros.ros.shutdown)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(
                        f"cluster model(s) {stale} for round {round_idx} did not arrive "
                        f"within {timeout:.0f} s"
                    )
                self.lock.wait(min(remaining, shutdown.POLL_S))
            models = {c: have[c][1] for c in needed}
        return weighted_model(models, [(c, w) for c, w in membership if w > 0])

    def newest_for(self, robot_id: str) -> tuple[StateDict, list[int]]:
        """Newest model of a robot: mean of the newest cluster models listing it as a member."""
        with self.lock:
            mine = {c: v for c, v in self.entries.items() if robot_id in v[3]}
            if not mine:
                raise ValueError("no cluster model received yet")
            newest = max(v[0] for v in mine.values())
            cids = sorted(c for c, v in mine.items() if v[0] == newest)
            models = {c: mine[c][1] for c in cids}
        return weighted_model(models, [(c, 1.0) for c in cids]), cids
