"""Success and training loss per round, per robot and per cluster: what the live view charts.

A :class:`RoundHistory` takes the round reports a `FleetMonitor` hears (as plain dicts,
:func:`fed_ros.ros.operator.monitor.report_to_dict`) and keeps, for the newest ``max_rounds``
rounds, each robot's success rate, training loss, sample count and clusters. A cluster's value
in a round is computed from its members of that round: the sample-weighted mean training loss
(the weights FedAvg gives their updates) and the mean success rate of the members that were
evaluated. No ROS: the monitor's executor adds reports, the web server's threads read the
series, under one lock.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from typing import Any

HISTORY_ROUNDS = 200  # rounds kept: a chart of more rounds than pixels shows nothing more


def _finite(value: Any) -> float | None:
    """JSON has no NaN: a value that was not measured is None."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _mean(values: list[float], weights: list[float]) -> float | None:
    """The weighted mean, the plain mean when no weight is positive, None when empty."""
    if not values:
        return None
    total = sum(weights)
    if total <= 0:
        return sum(values) / len(values)
    return sum(v * w for v, w in zip(values, weights)) / total


class RoundHistory:
    """Per-round metrics of the newest ``max_rounds`` rounds, one entry per round."""

    def __init__(self, max_rounds: int = HISTORY_ROUNDS) -> None:
        if isinstance(max_rounds, bool) or not isinstance(max_rounds, int) or max_rounds < 1:
            raise ValueError(f"max_rounds must be a positive integer, got {max_rounds!r}")
        self.max_rounds = max_rounds
        self._lock = threading.Lock()
        self._rounds: dict[int, dict[str, Any]] = {}  # round -> {"completed", "robots": {...}}

    def __len__(self) -> int:
        with self._lock:
            return len(self._rounds)

    def add(self, report: Mapping[str, Any]) -> None:
        """Take one round report; a retried round's completed report replaces its abandoned
        attempt (never the reverse), and the oldest rounds beyond the bound are dropped."""
        round_idx = int(report["round"])
        completed = bool(report.get("completed", False))
        robots = {
            str(line["robot_id"]): {
                "success": _finite(line.get("success_rate")),
                "train_loss": _finite(line.get("train_loss")),
                "num_samples": max(0, int(line.get("num_samples", 0) or 0)),
                "clusters": sorted({int(c) for c in line.get("cluster_ids", ())}),
            }
            for line in report.get("robots", ())
        }
        with self._lock:
            kept = self._rounds.get(round_idx)
            if kept is not None and kept["completed"] and not completed:
                return
            if kept is None and len(self._rounds) >= self.max_rounds:
                if round_idx < min(self._rounds):
                    return  # older than every kept round: a late copy of a dropped one
                del self._rounds[min(self._rounds)]
            self._rounds[round_idx] = {"completed": completed, "robots": robots}

    def series(self) -> dict[str, Any]:
        """JSON-safe chart data: ``rounds`` ascending, and for each robot and each cluster one
        ``success`` and one ``train_loss`` value per round (None where not measured)."""
        with self._lock:
            rounds = sorted(self._rounds)
            entries = [self._rounds[r] for r in rounds]
        robot_ids = sorted({rid for e in entries for rid in e["robots"]})
        robots = [
            {
                "id": rid,
                **{
                    key: [e["robots"].get(rid, {}).get(key) for e in entries]
                    for key in ("success", "train_loss")
                },
            }
            for rid in robot_ids
        ]
        cluster_ids = sorted(
            {c for e in entries for line in e["robots"].values() for c in line["clusters"]}
        )
        clusters = []
        for cid in cluster_ids:
            success, loss, members = [], [], []
            for e in entries:
                lines = [
                    (rid, line)
                    for rid, line in sorted(e["robots"].items())
                    if cid in line["clusters"]
                ]
                evaluated = [line["success"] for _, line in lines if line["success"] is not None]
                trained = [line for _, line in lines if line["train_loss"] is not None]
                success.append(_mean(evaluated, [1.0] * len(evaluated)))
                loss.append(
                    _mean([t["train_loss"] for t in trained], [t["num_samples"] for t in trained])
                )
                members.append([rid for rid, _ in lines])
            clusters.append({"id": cid, "success": success, "train_loss": loss, "members": members})
        return {
            "rounds": rounds,
            "completed": [e["completed"] for e in entries],
            "robots": robots,
            "clusters": clusters,
        }
