"""What a closed round reports (pure, no ROS): the outcome the server node turns into a RoundReport.

:class:`RoundOutcome` with a :class:`RobotOutcome` line per participant (built from a stage's
collector by :func:`round_outcome`), and the round metrics: the strategy's diagnostics
flattened to scalars, each cluster's members, the members' update similarity and how far
each cluster's model moved.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from fed_ros.core.rounds.collect import StageCollector
from fed_ros.core.rounds.config import Membership


@dataclass
class RobotOutcome:
    """Per-robot line of a round report."""

    robot_id: str
    cluster_ids: list[int] = field(default_factory=list)
    num_samples: int = 0
    train_loss: float = float("nan")
    val_loss: float = float("nan")
    success_rate: float = float("nan")
    accepted: bool = False
    reason: str = ""
    # Human interventions during the evaluation (per episode; NaN: not evaluated or reported).
    interventions_per_episode: float = float("nan")
    human_seconds_per_episode: float = float("nan")


@dataclass
class RoundOutcome:
    """What happened to a round (the node turns it into a RoundReport)."""

    round_idx: int
    algorithm: str
    completed: bool
    status: str
    updates_received: int
    updates_accepted: int
    updates_rejected: int
    aggregation_seconds: float = 0.0
    robots: list[RobotOutcome] = field(default_factory=list)
    clusters: dict[int, list[str]] = field(default_factory=dict)
    cluster_update_norms: dict[int, float] = field(default_factory=dict)
    cluster_intra_similarity: dict[int, float] = field(default_factory=dict)
    diagnostics: dict[str, float] = field(default_factory=dict)


def scalar_diagnostics(diag: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """Flatten a strategy's diagnostics to name/value pairs (scalars only; arrays summarised)."""
    out: dict[str, float] = {}
    for key, value in diag.items():
        name = f"{prefix}{key}"
        if isinstance(value, (bool, np.bool_)):
            out[name] = float(value)
        elif isinstance(value, (int, float, np.integer, np.floating)):
            out[name] = float(value)
        elif isinstance(value, Mapping):
            out.update(scalar_diagnostics(value, prefix=f"{name}."))
        elif (
            isinstance(value, (list, tuple))
            and value
            and all(
                isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
                for v in value
            )
        ):
            for i, v in enumerate(value):
                out[f"{name}[{i}]"] = float(v)
    return out


# Elements per block of the members' pass: a float64 and a float32 buffer of this size stay
# in a core's L2 cache, and no member allocates (fresh 88 MB float64 diffs per member of an 11M
# policy cost 114 ms of CPU each, most of it page faults: 1000 members took ~2 minutes).
SIMILARITY_BLOCK = 1 << 16


def intra_cluster_similarity(
    params: Mapping[str, Mapping[str, np.ndarray]],
    initial: Mapping[str, np.ndarray],
    clusters: Mapping[int, Sequence[str]],
) -> dict[int, float]:
    """Mean pairwise cosine similarity of members' accumulated updates (theta_k - theta_0), per
    cluster.

    NaN for clusters with fewer than two members that sent an update this round. The updates
    are float32 differences and the cosines float64; the mean over ordered pairs i != j is
    (||sum_k u_k||^2 - n) / (k (k - 1)) with u_k the unit updates and n the nonzero ones, so
    members are read one at a time (a float64 model per cluster in memory, not members x
    parameters: stacked, a report of 1000 robots x 11M parameters took 44 GB), and each member
    in blocks of ``SIMILARITY_BLOCK`` elements, twice: its norm, then its unit update.
    """
    names = list(initial)
    base = [np.asarray(initial[k], np.float32).reshape(-1) for k in names]
    offsets = np.cumsum([0] + [b.size for b in base])
    diff32 = np.empty(SIMILARITY_BLOCK, np.float32)
    diff64 = np.empty(SIMILARITY_BLOCK, np.float64)
    out: dict[int, float] = {}
    for cid, members in clusters.items():
        present = [p for rid in members if (p := params.get(rid)) is not None]
        if len(present) < 2:
            out[cid] = float("nan")
            continue
        total = np.zeros(int(offsets[-1]), np.float64)
        nonzero = 0
        for p in present:
            rows = [np.asarray(p[k], np.float32).reshape(-1) for k in names]
            squares = 0.0
            for d in _update_blocks(rows, base, diff32, diff64):
                squares += float(d @ d)
            norm = math.sqrt(squares)
            if norm == 0.0:
                continue  # an unchanged member: cosine 0 with every other
            nonzero += 1
            at = 0
            for d in _update_blocks(rows, base, diff32, diff64):
                d /= norm
                total[at : at + d.size] += d
                at += d.size
        k = len(present)
        out[cid] = float((float(total @ total) - nonzero) / (k * (k - 1)))
    return out


def _update_blocks(
    rows: Sequence[np.ndarray],
    base: Sequence[np.ndarray],
    diff32: np.ndarray,
    diff64: np.ndarray,
) -> Iterator[np.ndarray]:
    """(row - base) block by block, in the model's order: the float32 difference widened to
    float64, in ``diff64`` (each block is overwritten by the next)."""
    step = diff32.size
    for row, b in zip(rows, base):
        for lo in range(0, row.size, step):
            n = min(step, row.size - lo)
            np.subtract(row[lo : lo + n], b[lo : lo + n], out=diff32[:n])
            d = diff64[:n]
            d[...] = diff32[:n]
            yield d


def cluster_update_norms(
    new: Mapping[int, Mapping[str, np.ndarray]], old: Mapping[int, Mapping[str, np.ndarray]]
) -> dict[int, float]:
    """L2 norm (float64) of each cluster model's change; clusters new this round have none."""
    out: dict[int, float] = {}
    for cid, model in new.items():
        if cid in old:
            out[cid] = float(
                math.sqrt(
                    sum(
                        float(np.sum((model[k].astype(np.float64) - old[cid][k]) ** 2))
                        for k in model
                    )
                )
            )
    return out


def members_of(assignments: Mapping[str, Membership]) -> dict[int, list[str]]:
    clusters: dict[int, list[str]] = {}
    for rid in sorted(assignments):
        for cid, weight in assignments[rid]:
            if weight > 0:
                clusters.setdefault(int(cid), []).append(rid)
    return clusters


def round_outcome(
    col: StageCollector,
    completed: bool,
    status: str,
    assignments: Mapping[str, Membership] | None = None,
) -> RoundOutcome:
    """The report of a closed stage: per-robot lines (accepted, losses, the reason when not),
    counts, clusters."""
    plan = col.plan
    reasons: dict[str, str] = {}
    for rid, reason in col.rejections:
        reasons.setdefault(rid, reason)
    for rid, reason in col.declined.items():
        reasons.setdefault(rid, reason)
    robots = []
    assignments = assignments if assignments is not None else plan.memberships
    for rid in plan.participants:
        upd = col.answers.get(rid)
        metrics = getattr(upd, "metrics", {}) or {}
        robots.append(
            RobotOutcome(
                robot_id=rid,
                cluster_ids=[int(c) for c, _ in assignments.get(rid, [])],
                num_samples=int(getattr(upd, "num_samples", 0)),
                train_loss=float(metrics.get("train_loss", float("nan"))),
                val_loss=float(metrics.get("val_loss", float("nan"))),
                accepted=completed and rid in col.answers,
                reason=(
                    reasons.get(rid, "")
                    if rid not in col.answers
                    else ("" if completed else "round abandoned")
                )
                or ("" if rid in col.answers else "straggler: no update by the deadline"),
            )
        )
    received = len(col.answers) + col.rejected
    return RoundOutcome(
        round_idx=plan.round_idx,
        algorithm=plan.algorithm,
        completed=completed,
        status=status,
        updates_received=received,
        updates_accepted=len(col.answers) if completed else 0,
        updates_rejected=col.rejected,
        robots=robots,
        clusters=members_of(assignments),
    )


def completed_outcome(
    col: StageCollector,
    reason: str,
    result: Any,
    seconds: float,
    updates: Sequence[Any],
    initial_model: Mapping[str, np.ndarray],
    old_models: Mapping[int, Mapping[str, np.ndarray]],
) -> RoundOutcome:
    """The report of an aggregated round: its robots and clusters, how long aggregation took,
    the strategy's diagnostics, the members' update similarity and how far each cluster moved.

    ``result`` is the strategy's RoundResult (new cluster models, assignments, diagnostics),
    ``updates`` the aggregated ClientUpdates, ``old_models`` the cluster models before.
    """
    status = "completed" + (f" ({reason})" if reason else "")
    outcome = round_outcome(col, completed=True, status=status, assignments=result.assignments)
    outcome.aggregation_seconds = seconds
    outcome.diagnostics = scalar_diagnostics(getattr(result, "diagnostics", {}) or {})
    outcome.cluster_intra_similarity = intra_cluster_similarity(
        {u.robot_id: u.params for u in updates}, initial_model, outcome.clusters
    )
    new_models = {int(c): m for c, m in result.cluster_models.items()}
    outcome.cluster_update_norms.update(cluster_update_norms(new_models, old_models))
    return outcome


def robot_report_cells(robot: Mapping[str, Any]) -> tuple[str, str, str]:
    """(success, train loss, clusters) of one robot line of a report dict, as the tables print
    them: "-" for a value the round did not measure (NaN) and for no cluster."""
    success = "-" if np.isnan(robot["success_rate"]) else f"{robot['success_rate']:.2f}"
    loss = "-" if np.isnan(robot["train_loss"]) else f"{robot['train_loss']:.3f}"
    clusters = ",".join(str(c) for c in robot["cluster_ids"]) or "-"
    return success, loss, clusters


def intervention_cell(robot: Mapping[str, Any]) -> str:
    """Human interventions of one robot line of a report dict: "<n>/ep <s> s/ep", or "-" when
    the round did not evaluate it or the robot reported none (NaN; a report from before the
    field existed has no key)."""
    per_episode = float(robot.get("interventions_per_episode", math.nan))
    seconds = float(robot.get("human_seconds_per_episode", math.nan))
    if math.isnan(per_episode):
        return "-"
    return f"{per_episode:.2f}/ep {seconds:.1f} s/ep"
