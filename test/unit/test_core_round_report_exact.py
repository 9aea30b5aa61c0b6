"""The round report (fed_ros/core/rounds/report.py) exactly: the documented defaults of a report's
lines, the strategy diagnostics flattened to scalars, the members' mean pairwise update cosine
per cluster (against a straightforward float64 reference of its docstring), the cluster member
lists, the per-robot lines and counts of a closed stage, and the table cells the monitor and
the demo print.

ROS-free, no torch; deterministic (seeded).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from fed_ros.core.rounds.collect import RoundPlan, StageCollector
from fed_ros.core.rounds.report import (
    RobotOutcome,
    RoundOutcome,
    intervention_cell,
    SIMILARITY_BLOCK,
    intra_cluster_similarity,
    members_of,
    robot_report_cells,
    round_outcome,
    scalar_diagnostics,
)
from fed_ros.core.strategies.types import ClientUpdate

NAN = float("nan")


def _same(a: list, b: list) -> bool:
    """Equal lists of RobotOutcome, NaN equal to NaN."""

    def key(r: RobotOutcome) -> tuple:
        return (
            r.robot_id,
            r.cluster_ids,
            r.num_samples,
            repr(r.train_loss),
            repr(r.val_loss),
            repr(r.success_rate),
            r.accepted,
            r.reason,
        )

    return [key(r) for r in a] == [key(r) for r in b]


# --- the report's lines: documented defaults ---------------------------------------------------


def test_robot_outcome_defaults():
    r = RobotOutcome("robot_0")
    assert r.robot_id == "robot_0"
    assert r.cluster_ids == [] and r.num_samples == 0 and type(r.num_samples) is int
    assert math.isnan(r.train_loss) and math.isnan(r.val_loss) and math.isnan(r.success_rate)
    assert r.accepted is False and r.reason == ""
    # each line has its own cluster list
    r.cluster_ids.append(1)
    assert RobotOutcome("robot_1").cluster_ids == []


def test_round_outcome_defaults():
    o = RoundOutcome(3, "fedavg", True, "completed", 4, 3, 1)
    assert (o.round_idx, o.algorithm, o.completed, o.status) == (3, "fedavg", True, "completed")
    assert (o.updates_received, o.updates_accepted, o.updates_rejected) == (4, 3, 1)
    assert o.aggregation_seconds == 0.0
    assert o.robots == [] and o.clusters == {} and o.cluster_update_norms == {}
    assert o.cluster_intra_similarity == {} and o.diagnostics == {}
    o.clusters[0] = ["robot_0"]
    o.diagnostics["x"] = 1.0
    other = RoundOutcome(4, "fedavg", True, "completed", 0, 0, 0)
    assert other.clusters == {} and other.diagnostics == {}


# --- scalar_diagnostics ------------------------------------------------------------------------


def test_scalar_diagnostics_flattens_exactly():
    diag = {
        "flag": True,
        "off": np.bool_(False),
        "n": 3,
        "x": 0.25,
        "i64": np.int64(-7),
        "f32": np.float32(1.5),
        "nested": {"a": 2, "deeper": {"b": False}, "s": "skip"},
        "list": [1, 2.5, np.int32(4)],
        "tup": (np.float64(0.5),),
        "empty": [],
        "with_bool": [1, True],
        "with_str": [1, "a"],
        "text": "hello",
        "none": None,
        "array": np.array([1.0, 2.0]),
    }
    out = scalar_diagnostics(diag)
    assert out == {
        "flag": 1.0,
        "off": 0.0,
        "n": 3.0,
        "x": 0.25,
        "i64": -7.0,
        "f32": 1.5,
        "nested.a": 2.0,
        "nested.deeper.b": 0.0,
        "list[0]": 1.0,
        "list[1]": 2.5,
        "list[2]": 4.0,
        "tup[0]": 0.5,
    }
    assert list(out) == [
        "flag",
        "off",
        "n",
        "x",
        "i64",
        "f32",
        "nested.a",
        "nested.deeper.b",
        "list[0]",
        "list[1]",
        "list[2]",
        "tup[0]",
    ]
    assert all(type(v) is float for v in out.values())


def test_scalar_diagnostics_prefix_and_empty():
    assert scalar_diagnostics({}) == {}
    assert scalar_diagnostics({"a": 1, "m": {"b": [2]}}, prefix="p.") == {
        "p.a": 1.0,
        "p.m.b[0]": 2.0,
    }
    assert scalar_diagnostics({"": 1}) == {"": 1.0}  # default prefix is empty


# --- intra_cluster_similarity ------------------------------------------------------------------


def _reference(params, initial, members) -> float:
    # the updates are float32 differences (the models' dtype); the cosines are float64
    base = np.concatenate([np.asarray(v, np.float32).reshape(-1) for v in initial.values()])
    rows = [
        (
            np.concatenate([np.asarray(params[r][k], np.float32).reshape(-1) for k in initial])
            - base
        ).astype(np.float64)
        for r in members
        if r in params
    ]
    sims = []
    for i, a in enumerate(rows):
        for j, b in enumerate(rows):
            if i != j:
                na, nb = np.linalg.norm(a), np.linalg.norm(b)
                sims.append(0.0 if na == 0 or nb == 0 else float(a @ b / (na * nb)))
    return float(np.mean(sims))


def test_intra_cluster_similarity_matches_reference():
    rng = np.random.default_rng(7)
    initial = {
        "w": rng.normal(size=(2, 3)).astype(np.float32),
        "b": rng.normal(size=4).astype(np.float32),
    }
    params = {
        f"r{i}": {
            "b": rng.normal(size=4).astype(np.float32),  # keys in another order than initial's
            "w": rng.normal(size=(2, 3)).astype(np.float32),
        }
        for i in range(5)
    }
    clusters = {0: ["r0", "r1", "r2"], 1: ["r3", "r4", "gone"], 2: ["r4"], 3: ["gone", "r0"], 4: []}
    out = intra_cluster_similarity(params, initial, clusters)
    assert list(out) == [0, 1, 2, 3, 4]
    assert out[0] == pytest.approx(_reference(params, initial, clusters[0]), rel=1e-12, abs=1e-15)
    assert out[1] == pytest.approx(_reference(params, initial, ["r3", "r4"]), rel=1e-12, abs=1e-15)
    assert all(math.isnan(out[c]) for c in (2, 3, 4))
    assert all(type(v) is float for v in out.values())


def test_intra_cluster_similarity_exact_small_cases():
    initial = {"w": np.zeros((2, 2), np.float32)}
    p = {
        "a": {"w": np.array([[1, 0], [0, 0]], np.float32)},
        "b": {"w": np.array([[1, 1], [0, 0]], np.float32)},
        "c": {"w": np.array([[-1, 0], [0, 0]], np.float32)},
        "z": {"w": np.zeros((2, 2), np.float32)},
    }
    out = intra_cluster_similarity(
        p, initial, {0: ["a", "b"], 1: ["a", "c"], 2: ["a", "b", "c"], 3: ["a", "z"], 5: ["a", "a"]}
    )
    assert out[0] == pytest.approx(1 / math.sqrt(2), rel=1e-12)
    assert out[1] == pytest.approx(-1.0, rel=1e-12)
    # pairs: a-b 1/sqrt2, a-c -1, b-c -1/sqrt2 -> mean over the 3 pairs (6 ordered)
    assert out[2] == pytest.approx((1 / math.sqrt(2) - 1 - 1 / math.sqrt(2)) / 3, rel=1e-12)
    assert out[3] == 0.0  # an unchanged member's update is zero: cosine 0, not NaN
    assert out[5] == pytest.approx(1.0, rel=1e-12)


def test_intra_cluster_similarity_is_of_updates_in_float32():
    # theta_k - theta_0, not theta_k: a common offset cancels
    initial = {"w": np.full(3, 5.0, np.float32)}
    p = {
        "a": {"w": np.array([6.0, 5.0, 5.0], np.float32)},
        "b": {"w": np.array([5.0, 6.0, 5.0], np.float32)},
    }
    assert intra_cluster_similarity(p, initial, {0: ["a", "b"]})[0] == 0.0
    # values are taken as float32: 1e8 + 1 is 1e8 there, so both updates are zero
    big = {"w": np.array([1e8, 1e8])}
    q = {"a": {"w": np.array([1e8 + 1, 1e8])}, "b": {"w": np.array([1e8 + 1, 1e8])}}
    assert intra_cluster_similarity(q, big, {0: ["a", "b"]})[0] == 0.0
    # both the models and the initial model are taken as float32 (1e8 + 1 -> 1e8 on either side)
    big = {"w": np.array([1e8 + 1, 0.0])}
    q = {"a": {"w": np.array([1e8 + 1, 1.0])}, "b": {"w": np.array([1e8 + 1, -1.0])}}
    assert intra_cluster_similarity(q, big, {0: ["a", "b"]})[0] == -1.0
    # the float64 similarity: float32 rounding of the products would show at 1e-8
    v = np.array([0.1, 0.2, 0.7], np.float32)
    w = np.array([0.3, 0.1, 0.5], np.float32)
    out = intra_cluster_similarity(
        {"a": {"w": v}, "b": {"w": w}}, {"w": np.zeros(3, np.float32)}, {0: ["a", "b"]}
    )
    a, b = v.astype(np.float64), w.astype(np.float64)
    assert out[0] == pytest.approx(float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)), rel=1e-14)


# --- members_of --------------------------------------------------------------------------------


def test_members_of_positive_weights_sorted_by_robot():
    assignments = {
        "r2": [(1, 1.0)],
        "r0": [(np.int64(1), 0.5), (0, 0.5)],
        "r1": [(0, 0.0), (2, 1e-9)],
        "r3": [],
        "r4": [(1.0, -1.0)],
    }
    out = members_of(assignments)
    assert out == {1: ["r0", "r2"], 0: ["r0"], 2: ["r1"]}
    assert list(out) == [1, 0, 2]
    assert all(type(c) is int for c in out)
    assert members_of({}) == {}


# --- round_outcome -----------------------------------------------------------------------------


def _plan(memberships=None) -> RoundPlan:
    parts = ("r0", "r1", "r2", "r3", "r4")
    return RoundPlan(
        round_idx=4,
        stage="train",
        attempt=1,
        deadline_s=10.0,
        algorithm="ifca",
        participants=parts,
        memberships=memberships
        if memberships is not None
        else {"r0": [(0, 1.0)], "r1": [(1, 1.0)], "r2": [(0, 0.5), (1, 0.5)], "r3": [(1, 0.0)]},
        quorum=2,
    )


def _upd(rid, n, metrics):
    return ClientUpdate(
        robot_id=rid,
        params={"w": np.zeros(2, np.float32)},
        num_samples=n,
        base_round=4,
        metrics=metrics,
    )


def _collector() -> StageCollector:
    col = StageCollector(_plan())
    col.accept("r0", _upd("r0", 12, {"train_loss": 0.5, "val_loss": 0.75}))
    col.accept("r1", SimpleNamespace(num_samples=np.int64(7), metrics=None))
    col.accept("r4", object())  # an answer without samples or metrics (e.g. a descriptor)
    col.reject("r2", "stale base: first")
    col.reject("r2", "late: second")
    col.reject("stranger", "not a participant")
    col.rejections.append(("r2", "a later reason"))  # the report keeps the first reason per robot
    return col


def test_round_outcome_completed():
    out = round_outcome(_collector(), completed=True, status="completed")
    assert (out.round_idx, out.algorithm, out.completed, out.status) == (
        4,
        "ifca",
        True,
        "completed",
    )
    assert (out.updates_received, out.updates_accepted, out.updates_rejected) == (3 + 3, 3, 3)
    assert out.aggregation_seconds == 0.0 and out.diagnostics == {}
    assert out.clusters == {0: ["r0", "r2"], 1: ["r1", "r2"]}
    assert _same(
        out.robots,
        [
            RobotOutcome("r0", [0], 12, 0.5, 0.75, NAN, True, ""),
            RobotOutcome("r1", [1], 7, NAN, NAN, NAN, True, ""),
            RobotOutcome("r2", [0, 1], 0, NAN, NAN, NAN, False, "stale base: first"),
            RobotOutcome(
                "r3", [1], 0, NAN, NAN, NAN, False, "straggler: no update by the deadline"
            ),
            RobotOutcome("r4", [], 0, NAN, NAN, NAN, True, ""),
        ],
    )
    assert all(type(r.num_samples) is int and type(r.train_loss) is float for r in out.robots)


def test_round_outcome_abandoned():
    out = round_outcome(_collector(), completed=False, status="abandoned: no quorum")
    assert (out.completed, out.status) == (False, "abandoned: no quorum")
    assert (out.updates_received, out.updates_accepted, out.updates_rejected) == (6, 0, 3)
    assert [(r.robot_id, r.accepted, r.reason) for r in out.robots] == [
        ("r0", False, "round abandoned"),
        ("r1", False, "round abandoned"),
        ("r2", False, "stale base: first"),
        ("r3", False, "straggler: no update by the deadline"),
        ("r4", False, "round abandoned"),
    ]
    assert out.robots[0].train_loss == 0.5 and out.robots[0].num_samples == 12


def test_round_outcome_uses_given_assignments():
    new = {"r0": [(2, 1.0)], "r3": [(np.int64(5), 0.25), (2, 0.75)], "r9": [(7, 1.0)]}
    out = round_outcome(_collector(), completed=True, status="completed", assignments=new)
    assert out.clusters == {2: ["r0", "r3"], 5: ["r3"], 7: ["r9"]}
    assert [r.cluster_ids for r in out.robots] == [[2], [], [], [5, 2], []]
    assert all(type(c) is int for r in out.robots for c in r.cluster_ids)
    # an empty assignment map is used as given, not replaced by the plan's
    empty = round_outcome(_collector(), completed=True, status="completed", assignments={})
    assert empty.clusters == {} and all(r.cluster_ids == [] for r in empty.robots)


def test_round_outcome_empty_stage():
    col = StageCollector(_plan(memberships={}))
    out = round_outcome(col, completed=True, status="completed")
    assert (out.updates_received, out.updates_accepted, out.updates_rejected) == (0, 0, 0)
    assert [r.reason for r in out.robots] == ["straggler: no update by the deadline"] * 5
    assert [r.accepted for r in out.robots] == [False] * 5


# --- robot_report_cells ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "robot,cells",
    [
        (
            {"success_rate": 0.5, "train_loss": 0.12345, "cluster_ids": [0, 2]},
            ("0.50", "0.123", "0,2"),
        ),
        ({"success_rate": 1.0, "train_loss": 2.0, "cluster_ids": [3]}, ("1.00", "2.000", "3")),
        ({"success_rate": NAN, "train_loss": NAN, "cluster_ids": []}, ("-", "-", "-")),
        (
            {"success_rate": 0.0, "train_loss": 0.0, "cluster_ids": (1, 10)},
            ("0.00", "0.000", "1,10"),
        ),
    ],
)
def test_robot_report_cells(robot, cells):
    assert robot_report_cells(robot) == cells


@pytest.mark.parametrize(
    "robot,cell",
    [
        ({"interventions_per_episode": 1.5, "human_seconds_per_episode": 4.25}, "1.50/ep 4.2 s/ep"),
        ({"interventions_per_episode": 0.0, "human_seconds_per_episode": 0.0}, "0.00/ep 0.0 s/ep"),
        ({"interventions_per_episode": NAN, "human_seconds_per_episode": NAN}, "-"),
        ({"success_rate": 1.0}, "-"),  # a report from before interventions were reported
    ],
)
def test_intervention_cell(robot, cell):
    assert intervention_cell(robot) == cell


def test_intra_cluster_similarity_reads_members_one_at_a_time():
    import tracemalloc

    # 40 members of 200,000 parameters sharing a direction: stacked in float64 they are 64 MB.
    rng = np.random.default_rng(3)
    size = 200_000
    initial = {"a": np.zeros(size // 2, np.float32), "b": np.zeros(size // 2, np.float32)}
    shared = rng.standard_normal(size).astype(np.float32)
    params = {}
    for i in range(40):
        row = shared + 0.3 * rng.standard_normal(size).astype(np.float32)
        params[f"r{i}"] = {"a": row[: size // 2], "b": row[size // 2 :]}
    members = {0: sorted(params)}
    tracemalloc.start()
    try:
        out = intra_cluster_similarity(params, initial, members)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    model64 = size * 8
    assert peak < 4 * model64, f"peak {peak / 1e6:.1f} MB: members were stacked"
    # One float64 model (the cluster's sum) and the fixed block buffers: no member's update is
    # ever whole in float64 (that cost 114 ms of page faults per member of an 11M policy).
    buffers = SIMILARITY_BLOCK * (8 + 4)
    assert peak < model64 + buffers + 100_000, f"peak {peak / 1e6:.2f} MB: a whole diff per member"
    # The stacked computation it replaces, as the reference.
    rows = np.stack([np.concatenate([params[r]["a"], params[r]["b"]]) for r in members[0]])
    unit = rows.astype(np.float64)
    unit /= np.linalg.norm(unit, axis=1, keepdims=True)
    sims = unit @ unit.T
    k = len(rows)
    assert out[0] == pytest.approx((sims.sum() - np.trace(sims)) / (k * (k - 1)), rel=1e-12)
    assert 0.9 < out[0] < 0.95
