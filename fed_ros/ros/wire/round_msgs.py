"""Round messages: updates and cluster models around a payload chunk, descriptors, announcements.

Pure conversions between core values (RoundConfig, ClientDescriptor, memberships) and the
generated fed_ros messages, unit-tested without ROS processes; the payload bytes themselves
are fed_ros.ros.wire.tensors'.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from fed_ros.core.rounds.config import RoundConfig
from fed_ros.core.checks import bounds
from fed_ros.msg import (
    ClientDescriptor as ClientDescriptorMsg,
    ClusterMembership,
    ClusterMetrics,
    ClusterModel,
    ModelUpdate,
    RobotMetrics,
    RoundAnnouncement,
    RoundConfig as RoundConfigMsg,
    RoundReport,
    TensorPayload,
)
from fed_ros.ros.wire.tensors import set_bytes_field, set_float32_field

if TYPE_CHECKING:
    from fed_ros.core.rounds.report import RoundOutcome
    from fed_ros.core.strategies.types import ClientDescriptor as CoreDescriptor

DESCRIPTOR_KINDS: dict[str, int] = {
    "gaussian": ClientDescriptorMsg.KIND_GAUSSIAN,
    "rnd": ClientDescriptorMsg.KIND_RND,
    "update": ClientDescriptorMsg.KIND_UPDATE,
    "embedding": ClientDescriptorMsg.KIND_EMBEDDING,
}
DESCRIPTOR_KIND_NAMES: dict[int, str] = {v: k for k, v in DESCRIPTOR_KINDS.items()}
STAGES: dict[str, int] = {
    "train": RoundAnnouncement.STAGE_TRAIN,
    "describe": RoundAnnouncement.STAGE_DESCRIBE,
    "score": RoundAnnouncement.STAGE_SCORE,
    "evaluate": RoundAnnouncement.STAGE_EVALUATE,
    "done": RoundAnnouncement.STAGE_DONE,
}
STAGE_NAMES: dict[int, str] = {v: k for k, v in STAGES.items()}


# ------------------------------------------------------------- model messages


def model_update_msg(
    chunk: TensorPayload,
    *,
    robot_id: str,
    round_idx: int,
    base_round: int,
    cluster_id: int = -1,
    num_samples: int = 0,
    train_loss: float = float("nan"),
    val_loss: float = float("nan"),
    nonce: bytes = b"",
    signature: bytes = b"",
    stamp: Any = None,
) -> ModelUpdate:
    """Wrap one payload chunk in a ModelUpdate (robot -> server)."""
    if not robot_id:
        raise ValueError("robot_id must not be empty")
    if round_idx < 0 or base_round < 0:
        raise ValueError(f"rounds must be >= 0, got round={round_idx} base_round={base_round}")
    if num_samples < 0:
        raise ValueError(f"num_samples must be >= 0, got {num_samples}")
    msg = ModelUpdate(
        robot_id=robot_id,
        round=int(round_idx),
        base_round=int(base_round),
        cluster_id=int(cluster_id),
        num_samples=int(num_samples),
        train_loss=float(train_loss),
        val_loss=float(val_loss),
        payload=chunk,
    )
    if stamp is not None:
        msg.header.stamp = stamp
    set_bytes_field(msg, "nonce", nonce)
    set_bytes_field(msg, "signature", signature)
    return msg


def cluster_model_msg(
    chunk: TensorPayload,
    *,
    cluster_id: int,
    round_idx: int,
    member_robot_ids: Sequence[str] = (),
    signature: bytes = b"",
    stamp: Any = None,
) -> ClusterModel:
    """Wrap one payload chunk in a ClusterModel (server -> robots)."""
    if round_idx < 0:
        raise ValueError(f"round must be >= 0, got {round_idx}")
    msg = ClusterModel(
        cluster_id=int(cluster_id),
        round=int(round_idx),
        member_robot_ids=[str(r) for r in member_robot_ids],
        payload=chunk,
    )
    if stamp is not None:
        msg.header.stamp = stamp
    set_bytes_field(msg, "signature", signature)
    return msg


# ---------------------------------------------------------------- descriptors


def descriptor_to_msg(
    desc: "CoreDescriptor",
    round_idx: int,
    nonce: bytes = b"",
    signature: bytes = b"",
    stamp: Any = None,
) -> ClientDescriptorMsg:
    """Core ClientDescriptor -> fed_ros/ClientDescriptor message."""
    if desc.kind not in DESCRIPTOR_KINDS:
        raise ValueError(
            f"unknown descriptor kind {desc.kind!r}; expected one of {sorted(DESCRIPTOR_KINDS)}"
        )
    mean = (
        np.zeros(0, np.float32)
        if desc.mean is None
        else np.asarray(desc.mean, np.float32).reshape(-1)
    )
    var = (
        np.zeros(0, np.float32)
        if desc.variance is None
        else np.asarray(desc.variance, np.float32).reshape(-1)
    )
    if var.size and var.size != mean.size:
        raise ValueError(
            f"descriptor of {desc.robot_id!r}: mean has {mean.size} dims, variance {var.size}"
        )
    names = sorted(desc.scores)
    msg = ClientDescriptorMsg(
        robot_id=desc.robot_id,
        round=int(round_idx),
        kind=DESCRIPTOR_KINDS[desc.kind],
        dims=int(mean.size),
        score_robot_ids=names,
        residual_std=float(desc.residual_std),
        num_samples=int(desc.num_samples),
    )
    if stamp is not None:
        msg.header.stamp = stamp
    set_float32_field(msg, "mean", mean)
    set_float32_field(msg, "variance", var)
    set_float32_field(msg, "scores", np.asarray([desc.scores[n] for n in names], np.float32))
    set_bytes_field(msg, "payload", bytes(desc.payload))
    set_bytes_field(msg, "nonce", nonce)
    set_bytes_field(msg, "signature", signature)
    return msg


def descriptor_from_msg(
    msg: ClientDescriptorMsg, max_dims: int = 1 << 16, max_payload_bytes: int = 16 << 20
) -> "CoreDescriptor":
    """fed_ros/ClientDescriptor -> core ClientDescriptor, validated (V5: finite, var > 0, dims)."""
    from fed_ros.core.strategies.types import ClientDescriptor as CoreDescriptor

    kind = DESCRIPTOR_KIND_NAMES.get(int(msg.kind))
    if kind is None:
        raise ValueError(f"descriptor from {msg.robot_id!r}: unknown kind {msg.kind}")
    if not msg.robot_id:
        raise ValueError("descriptor: empty robot_id")
    dims = int(msg.dims)
    if dims > max_dims:
        raise ValueError(f"descriptor from {msg.robot_id!r}: dims {dims} > cap {max_dims}")
    mean = (
        np.frombuffer(msg.mean, dtype=np.float32).copy()
        if len(msg.mean)
        else np.zeros(0, np.float32)
    )
    var = (
        np.frombuffer(msg.variance, dtype=np.float32).copy()
        if len(msg.variance)
        else np.zeros(0, np.float32)
    )
    if mean.size != dims or (var.size and var.size != dims):
        raise ValueError(
            f"descriptor from {msg.robot_id!r}: dims={dims} but mean has {mean.size}, "
            f"variance {var.size} values"
        )
    if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(var))):
        raise ValueError(f"descriptor from {msg.robot_id!r}: non-finite mean or variance")
    if var.size and not np.all(var > 0):
        raise ValueError(f"descriptor from {msg.robot_id!r}: variances must be > 0")
    if len(msg.score_robot_ids) != len(msg.scores):
        raise ValueError(
            f"descriptor from {msg.robot_id!r}: {len(msg.score_robot_ids)} score ids "
            f"but {len(msg.scores)} scores"
        )
    scores = {str(n): float(s) for n, s in zip(msg.score_robot_ids, msg.scores)}
    if not all(math.isfinite(s) for s in scores.values()):
        raise ValueError(f"descriptor from {msg.robot_id!r}: non-finite score")
    if len(msg.payload) > max_payload_bytes:
        raise ValueError(
            f"descriptor from {msg.robot_id!r}: payload {len(msg.payload)} B > cap "
            f"{max_payload_bytes}"
        )
    return CoreDescriptor(
        robot_id=str(msg.robot_id),
        kind=kind,
        mean=mean if dims else None,
        variance=var if var.size else None,
        num_samples=int(msg.num_samples),
        scores=scores,
        residual_std=float(msg.residual_std),
        payload=bytes(msg.payload),
    )


# -------------------------------------------------------------- announcements


@dataclass(frozen=True)
class Announcement:
    """A RoundAnnouncement as plain values."""

    round_idx: int
    stage: str
    deadline_s: float  # ROS time in seconds
    algorithm: str
    participants: tuple[str, ...]
    memberships: dict[str, list[tuple[int, float]]]
    quorum: int
    configs: dict[str, RoundConfig] = field(default_factory=dict)  # per robot; absent = defaults
    encoder_version: int = 0  # the fleet encoder the stage's policies read (0: no encoder stage)


def _check_membership(robot_id: str, membership: Sequence[tuple[int, float]]) -> None:
    if not membership:
        raise ValueError(f"membership of {robot_id!r} is empty")
    weights = [float(w) for _, w in membership]
    if not all(math.isfinite(w) and w >= 0 for w in weights):
        raise ValueError(f"membership of {robot_id!r} has invalid weights {weights}")
    if abs(sum(weights) - 1.0) > 1e-3:
        raise ValueError(f"membership weights of {robot_id!r} sum to {sum(weights)}, expected 1")


def round_config_to_msg(cfg: RoundConfig) -> RoundConfigMsg:
    """RoundConfig -> message (unset optional fields travel as 0)."""
    return RoundConfigMsg(
        version=cfg.version,
        prox_mu=cfg.prox_mu,
        use_sub=cfg.use_sub,
        use_act=cfg.use_act,
        lambda_sub=cfg.lambda_sub,
        lambda_act=cfg.lambda_act,
        local_epochs=cfg.local_epochs,
        local_steps=cfg.local_steps or 0,
        lr=cfg.lr or 0.0,
        descriptor_kind=cfg.descriptor_kind,
        pick_cluster=cfg.pick_cluster,
        eval_episodes=cfg.eval_episodes or 0,
    )


def round_config_from_msg(msg: RoundConfigMsg) -> RoundConfig:
    """Message -> RoundConfig; a bad value or unknown version raises ValueError naming it."""
    return RoundConfig(
        version=int(msg.version),
        prox_mu=float(msg.prox_mu),
        use_sub=bool(msg.use_sub),
        use_act=bool(msg.use_act),
        lambda_sub=float(msg.lambda_sub),
        lambda_act=float(msg.lambda_act),
        local_epochs=int(msg.local_epochs),
        local_steps=int(msg.local_steps) or None,
        lr=float(msg.lr) or None,
        descriptor_kind=str(msg.descriptor_kind),
        pick_cluster=bool(msg.pick_cluster),
        eval_episodes=int(msg.eval_episodes) or None,
    )


def announcement_to_msg(ann: Announcement) -> RoundAnnouncement:
    """Announcement -> RoundAnnouncement message (validated)."""
    if ann.stage not in STAGES:
        raise ValueError(f"unknown stage {ann.stage!r}; expected one of {sorted(STAGES)}")
    if ann.round_idx < 0 or ann.quorum < 0 or ann.encoder_version < 0:
        raise ValueError(f"round and quorum must be >= 0: {ann}")
    if ann.quorum > len(ann.participants):
        raise ValueError(f"quorum {ann.quorum} > {len(ann.participants)} participants")
    if not math.isfinite(ann.deadline_s) or ann.deadline_s < 0:
        raise ValueError(f"deadline must be a finite time >= 0, got {ann.deadline_s}")
    msg = RoundAnnouncement(
        round=int(ann.round_idx),
        stage=STAGES[ann.stage],
        algorithm=ann.algorithm,
        participants=list(ann.participants),
        quorum=int(ann.quorum),
        encoder_version=int(ann.encoder_version),
    )
    sec = int(math.floor(ann.deadline_s))
    msg.deadline.sec = sec
    msg.deadline.nanosec = min(int(round((ann.deadline_s - sec) * 1e9)), 999_999_999)
    members = []
    for robot_id, membership in ann.memberships.items():
        _check_membership(robot_id, membership)
        members.append(
            ClusterMembership(
                robot_id=robot_id,
                cluster_ids=[int(c) for c, _ in membership],
                weights=[float(w) for _, w in membership],
                config=round_config_to_msg(ann.configs.get(robot_id, RoundConfig())),
            )
        )
    msg.memberships = members
    return msg


def announcement_from_msg(msg: RoundAnnouncement) -> Announcement:
    """RoundAnnouncement message -> Announcement (validated)."""
    stage = STAGE_NAMES.get(int(msg.stage))
    if stage is None:
        raise ValueError(f"round announcement: unknown stage {msg.stage}")
    memberships: dict[str, list[tuple[int, float]]] = {}
    configs: dict[str, RoundConfig] = {}
    for m in msg.memberships:
        if len(m.cluster_ids) != len(m.weights):
            raise ValueError(
                f"membership of {m.robot_id!r}: {len(m.cluster_ids)} clusters, {len(m.weights)} "
                "weights"
            )
        membership = [(int(c), float(w)) for c, w in zip(m.cluster_ids, m.weights)]
        _check_membership(m.robot_id, membership)
        memberships[str(m.robot_id)] = membership
        try:
            configs[str(m.robot_id)] = round_config_from_msg(m.config)
        except ValueError as exc:
            raise ValueError(f"round config of {m.robot_id!r}: {exc}") from None
    return Announcement(
        round_idx=int(msg.round),
        stage=stage,
        deadline_s=msg.deadline.sec + msg.deadline.nanosec * 1e-9,
        algorithm=str(msg.algorithm),
        participants=tuple(msg.participants),
        memberships=memberships,
        quorum=int(msg.quorum),
        configs=configs,
        encoder_version=int(msg.encoder_version),
    )


def round_report_to_msg(outcome: "RoundOutcome", stamp) -> RoundReport:
    """A closed stage's report (core.round_report.RoundOutcome) as the RoundReport message, stamped
    ``stamp``; each robot's reason clipped to the message bound."""
    msg = RoundReport(
        round=outcome.round_idx,
        algorithm=outcome.algorithm,
        completed=outcome.completed,
        status=outcome.status,
        updates_received=outcome.updates_received,
        updates_accepted=outcome.updates_accepted,
        updates_rejected=outcome.updates_rejected,
        aggregation_seconds=float(outcome.aggregation_seconds),
    )
    msg.header.stamp = stamp
    msg.robots = [
        RobotMetrics(
            robot_id=r.robot_id,
            cluster_ids=r.cluster_ids,
            num_samples=r.num_samples,
            train_loss=r.train_loss,
            val_loss=r.val_loss,
            success_rate=r.success_rate,
            interventions_per_episode=r.interventions_per_episode,
            human_seconds_per_episode=r.human_seconds_per_episode,
            accepted=r.accepted,
            reason=r.reason[: bounds.MAX_REASON_CHARS],
        )
        for r in outcome.robots
    ]
    msg.clusters = [
        ClusterMetrics(
            cluster_id=cid,
            member_robot_ids=members,
            update_norm=float(outcome.cluster_update_norms.get(cid, math.nan)),
            intra_similarity=float(outcome.cluster_intra_similarity.get(cid, math.nan)),
        )
        for cid, members in sorted(outcome.clusters.items())
    ]
    names = sorted(outcome.diagnostics)
    msg.diagnostic_names = names
    msg.diagnostic_values = [float(outcome.diagnostics[n]) for n in names]
    return msg
