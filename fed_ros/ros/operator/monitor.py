"""Watching a running fleet from outside: announcements, round reports, published models.

Used by ``fed-ros status``, ``fed-ros demo`` and the simulation-in-the-loop tests. It
runs its own ``rclpy.Context`` so it can live inside any process.
"""

from __future__ import annotations

import math
import secrets
from typing import Any

import rclpy
from rclpy.executors import SingleThreadedExecutor
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

from fed_ros.msg import ClusterModel, RoundAnnouncement, RoundReport
from fed_ros.ros.operator.round_history import RoundHistory
from fed_ros.ros.wire.round_msgs import STAGE_NAMES
from fed_ros.core.rounds.report import intervention_cell, robot_report_cells


def _latched_reader(depth: int) -> QoSProfile:
    # Compatible with the server's TRANSIENT_LOCAL publishers; a deeper history on our side
    # keeps every report that arrives between two spins.
    return QoSProfile(
        reliability=ReliabilityPolicy.RELIABLE,
        durability=DurabilityPolicy.TRANSIENT_LOCAL,
        history=HistoryPolicy.KEEP_LAST,
        depth=depth,
    )


def report_to_dict(msg: Any) -> dict[str, Any]:
    """A RoundReport message as plain values."""
    return {
        "round": int(msg.round),
        "algorithm": msg.algorithm,
        "completed": bool(msg.completed),
        "status": msg.status,
        "updates_received": int(msg.updates_received),
        "updates_accepted": int(msg.updates_accepted),
        "updates_rejected": int(msg.updates_rejected),
        "aggregation_seconds": float(msg.aggregation_seconds),
        "robots": [
            {
                "robot_id": r.robot_id,
                "cluster_ids": [int(c) for c in r.cluster_ids],
                "num_samples": int(r.num_samples),
                "train_loss": float(r.train_loss),
                "val_loss": float(r.val_loss),
                "success_rate": float(r.success_rate),
                "interventions_per_episode": float(r.interventions_per_episode),
                "human_seconds_per_episode": float(r.human_seconds_per_episode),
                "accepted": bool(r.accepted),
                "reason": r.reason,
            }
            for r in msg.robots
        ],
        "clusters": [
            {
                "cluster_id": int(c.cluster_id),
                "members": list(c.member_robot_ids),
                "update_norm": float(c.update_norm),
                "intra_similarity": float(c.intra_similarity),
            }
            for c in msg.clusters
        ],
        "diagnostics": dict(zip(msg.diagnostic_names, [float(v) for v in msg.diagnostic_values])),
    }


class FleetMonitor:
    """Subscribes to a fleet server's announcement, reports and (optionally) cluster models."""

    def __init__(self, fleet_namespace: str = "/fleet", track_models: bool = True) -> None:
        self.context = rclpy.Context()
        rclpy.init(context=self.context)
        self.node = rclpy.create_node(
            f"fed_ros_monitor_{secrets.token_hex(3)}", context=self.context
        )
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        ns = fleet_namespace.rstrip("/")
        self.announcement: dict[str, Any] | None = None
        self.announcements: list[dict[str, Any]] = []
        self.reports: list[dict[str, Any]] = []
        # Success and training loss per round of the newest rounds (the live view's charts).
        self.history = RoundHistory()
        # (cluster_id, round) -> {"sha256", "members", "payload_id"} of published models.
        self.models: dict[tuple[int, int], dict[str, Any]] = {}
        self.model_log: list[
            tuple[int, int, str]
        ] = []  # every (cluster, round, sha256) message seen
        self.node.create_subscription(
            RoundAnnouncement, f"{ns}/round", self._on_announcement, _latched_reader(10)
        )
        self.node.create_subscription(
            RoundReport, f"{ns}/round_report", self._on_report, _latched_reader(50)
        )
        if track_models:
            self.node.create_subscription(
                ClusterModel, f"{ns}/cluster_models", self._on_model, _latched_reader(64)
            )

    def _on_announcement(self, msg) -> None:
        self.announcement = {
            "round": int(msg.round),
            "stage": STAGE_NAMES.get(int(msg.stage), str(msg.stage)),
            "algorithm": msg.algorithm,
            "participants": list(msg.participants),
            "quorum": int(msg.quorum),
            "deadline": msg.deadline.sec + msg.deadline.nanosec * 1e-9,
            "memberships": {
                m.robot_id: [(int(c), float(w)) for c, w in zip(m.cluster_ids, m.weights)]
                for m in msg.memberships
            },
        }
        self.announcements.append(self.announcement)

    def _on_report(self, msg) -> None:
        report = report_to_dict(msg)
        self.history.add(report)
        if not any(
            r["round"] == report["round"] and r["status"] == report["status"] for r in self.reports
        ):
            self.reports.append(report)

    def _on_model(self, msg) -> None:
        key = (int(msg.cluster_id), int(msg.round))
        self.models[key] = {
            "sha256": msg.payload.sha256,
            "members": list(msg.member_robot_ids),
            "payload_id": msg.payload.payload_id,
        }
        if msg.payload.chunk_index == 0:
            self.model_log.append((key[0], key[1], msg.payload.sha256))

    def robot_ids(self) -> list[str]:
        """Every robot the server named: participants of the newest announcement, members of
        its memberships, and robots of the reports heard."""
        ids = set((self.announcement or {}).get("participants", ()))
        ids |= set((self.announcement or {}).get("memberships", {}))
        ids |= {line["robot_id"] for report in self.reports for line in report.get("robots", [])}
        return sorted(ids)

    @property
    def last_report(self) -> dict[str, Any] | None:
        """The report of the latest round (of two for one round, the one received last).

        Not simply the last to arrive: a late joiner gets the latched history oldest first.
        """
        if not self.reports:
            return None
        return max(enumerate(self.reports), key=lambda ir: (ir[1]["round"], ir[0]))[1]

    @property
    def messages_received(self) -> int:
        """Announcements and reports taken so far (to tell when a latched history has drained)."""
        return len(self.announcements) + len(self.reports)

    def spin_once(self, timeout: float = 0.1) -> None:
        """Process pending messages (waits at most ``timeout`` seconds)."""
        self.executor.spin_once(timeout_sec=timeout)

    def summary(self) -> str:
        """What `fed-ros status` prints: round, stage, robots and clusters, last metrics."""
        lines = []
        ann = self.announcement
        if ann is not None:
            lines.append(
                f"fleet: {ann['algorithm']}, round {ann['round']}, stage {ann['stage']}, "
                f"{len(ann['participants'])} robots, quorum {ann['quorum']}"
            )
            clusters: dict[int, list[str]] = {}
            for rid, mem in sorted(ann["memberships"].items()):
                for cid, w in mem:
                    if w > 0:
                        clusters.setdefault(cid, []).append(
                            rid if math.isclose(w, 1.0) else f"{rid}({w:.2f})"
                        )
            for cid, members in sorted(clusters.items()):
                lines.append(f"  cluster {cid}: {', '.join(members)}")
        if self.last_report is not None:
            lines.append("last round report:")
            lines.append(format_report(self.last_report))
        return "\n".join(lines)

    def close(self) -> None:
        """Destroy the node and shut the private context down."""
        self.executor.shutdown()
        self.node.destroy_node()
        rclpy.try_shutdown(context=self.context)

    def __enter__(self) -> "FleetMonitor":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def format_report(report: dict) -> str:
    """A round report (as a dict) as the table `status` and `demo` print."""
    lines = [
        f"round {report['round']} ({report['algorithm']}): {report['status']}; updates "
        f"{report['updates_accepted']}/{report['updates_received']} accepted, "
        f"{report['updates_rejected']} rejected, aggregation {report['aggregation_seconds']:.2f} s"
    ]
    lines.append(
        f"  {'robot':<12} {'clusters':<10} {'samples':>8} {'train_loss':>10} {'success':>8} "
        f"{'interventions':>18}  note"
    )
    for r in report["robots"]:
        success, loss, clusters = robot_report_cells(r)
        lines.append(
            f"  {r['robot_id']:<12} {clusters:<10} {r['num_samples']:>8} {loss:>10} {success:>8} "
            f"{intervention_cell(r):>18}  {r['reason']}"
        )
    for c in report["clusters"]:
        lines.append(
            f"  cluster {c['cluster_id']}: {', '.join(c['members'])}  "
            f"|dtheta|={c['update_norm']:.4g}  update cosine {c['intra_similarity']:.2f}"
        )
    return "\n".join(lines)
