"""`fed-ros bench fleet-scale` in small: the real server node against 20 virtual robots (real
keys, signed int8_delta updates over ROS chunks), with and without faults."""

from __future__ import annotations

import pytest

from fed_ros.ros.bench.fleet_scale import (
    ScaleRun,
    adjusted_rand_index,
    compare_faults,
    fault_plan,
    run_round,
)
from fed_ros.ros.bench.fleet_scale_report import fitted_exponent, jitter_comparison

N = 20


def test_adjusted_rand_index_is_one_for_relabelled_partitions_and_low_for_mixed_ones():
    assert adjusted_rand_index([0, 0, 1, 1, 2, 2], [5, 5, 3, 3, 9, 9]) == pytest.approx(1.0)
    assert adjusted_rand_index([0, 0, 1, 1, 2, 2], [0, 1, 2, 0, 1, 2]) < 0.0


def test_fault_plan_takes_ten_percent_vanish_ten_percent_hostile_and_one_storm():
    plan = fault_plan(N)
    kinds = list(plan.values())
    assert kinds.count("vanish") == 2 and kinds.count("storm") == 1
    hostile = sorted(k for k in kinds if k not in ("", "vanish", "storm"))
    assert hostile == ["badsig", "nan", "oversized", "shape"]  # one of each kind at N = 20
    big = list(fault_plan(1000).values())
    assert (big.count("vanish"), big.count("storm"), big.count("badsig")) == (100, 10, 25)
    with pytest.raises(ValueError, match="at least 10 robots, got 9"):
        fault_plan(9)


def test_fitted_exponent_of_a_power_law():
    assert fitted_exponent([10, 100, 1000], [2.0, 200.0, 20000.0]) == pytest.approx(2.0)


def _run(n: int, jitter: float, round_s: float, resent: int) -> ScaleRun:
    zeros = dict.fromkeys(
        ("send_s", "server_cpu_s", "server_peak_rss_mb", "aggregation_s", "cpu_per_update_ms"), 0.0
    )
    counts = dict.fromkeys(
        ("prepared_used", "chunks_resent", "bytes_out", "bytes_in", "updates_received"), 0
    )
    return ScaleRun(
        robots=n, policy="image", encoding="int8_delta", channel="zmq", faults=False,
        completed=True, round_s=round_s, resent=resent, updates_accepted=n, updates_rejected=0,
        ari=1.0, load_average=0.0, robots_delivered=n, retry_jitter=jitter, **zeros, **counts,
    )  # fmt: skip


def test_jitter_comparison_puts_each_n_side_by_side_with_its_ratio():
    groups = {
        "image int8_delta zmq jitter 0": [_run(100, 0.0, 45.0, 201)],
        "image int8_delta zmq jitter 0.5": [_run(100, 0.5, 15.0, 120)],
    }
    lines = jitter_comparison(groups).splitlines()
    assert lines[0] == "image int8_delta zmq: re-send jitter side by side (ratio to jitter 0)"
    assert lines[2:] == [
        "100 | 0 | 45.0 | 1.00 | 201 | 0.00",
        "100 | 0.5 | 15.0 | 0.33 | 120 | 0.00",
    ]


def test_one_round_of_twenty_virtual_robots_recovers_the_families(ros_env, tmp_path):
    run = run_round(
        N,
        policy="image",
        encoding="int8_delta",
        procs=2,
        env=ros_env,
        work_dir=tmp_path,
        timeout_s=240.0,
    )
    assert run.completed and run.updates_accepted == N and run.updates_rejected == 0
    assert run.ari == pytest.approx(1.0)  # the four families are the four clusters
    assert run.robots_delivered == N  # every process assembled the same new cluster models
    assert sorted(run.robot_digests) == sorted(f"robot_{k}" for k in range(N))
    assert len(set(run.robot_digests.values())) == 4
    assert run.bytes_out > 0 and run.bytes_in > 0 and run.server_peak_rss_mb > 0
    assert 0 < run.server_peak_anon_mb <= run.server_peak_rss_mb
    assert run.prepared_used == N  # encoded before the round, from the server's own start


def test_synthetic_updates_are_deterministic_and_hold_the_families():
    import numpy as np

    from fed_ros.ros.bench.fleet_scale_robots import SyntheticUpdates, family_of

    rng = np.random.default_rng(0)
    start = {"a": rng.standard_normal((300, 40), dtype=np.float32), "b": np.zeros(7, np.float32)}
    make = SyntheticUpdates(families=4)
    first = make(start, 5, 0)
    again = SyntheticUpdates(families=4)(start, 5, 0)
    assert all(np.array_equal(first[k], again[k]) for k in start)  # bits, in a new process
    assert {k: v.shape for k, v in first.items()} == {k: v.shape for k, v in start.items()}

    def delta(index):
        upd = make(start, index, 0)
        return np.concatenate([(upd[k] - start[k]).ravel() for k in start])

    def cos(i, j):
        a, b = delta(i), delta(j)
        return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))

    same = [(i, j) for i in range(12) for j in range(i) if family_of(i, 4) == family_of(j, 4)]
    other = [(i, j) for i in range(12) for j in range(i) if family_of(i, 4) != family_of(j, 4)]
    assert min(cos(i, j) for i, j in same) > 0.9  # direction 4x the noise: ~0.94
    assert max(abs(cos(i, j)) for i, j in other) < 0.1
    assert not np.array_equal(delta(0), delta(4))  # same family, own noise
    assert not np.array_equal(make(start, 5, 1)["a"], first["a"])  # a new round, new noise


def test_a_resnet_sized_policy_set_by_architecture_parameters(ros_env, tmp_path):
    from fed_ros.ros.bench.fleet_scale import POLICIES

    kind, arch = POLICIES["image_11m"]
    from fed_ros.learning.configuration_policy import PolicyConfig
    from fed_ros.learning.trainer import initial_state_dict

    size = sum(a.size for a in initial_state_dict(PolicyConfig(kind=kind, **arch)).values())
    assert 10.5e6 < size < 11.5e6
    # The server node takes the architecture from architecture.* parameters: the robots'
    # updates of that size are admitted; two of four robots are encoded before the round.
    run = run_round(
        4,
        policy="image_11m",
        encoding="int8_delta",
        families=2,
        procs=1,
        channel="zmq",
        env=ros_env,
        work_dir=tmp_path,
        timeout_s=240.0,
        prepare_mb=16.0,
        unacked_mb=1.0,  # one update of 11 MB in flight at a time: each waits for its ack
    )
    assert run.completed and run.updates_accepted == 4 and run.ari == pytest.approx(1.0)
    assert run.prepared_used == 2  # 11 MB each in int8: the budget ends after the second


def test_faults_leave_the_honest_robots_models_bit_identical(ros_env, tmp_path):
    faulty, clean, differ = compare_faults(
        N,
        policy="image",
        encoding="int8_delta",
        procs=2,
        env=ros_env,
        work_dir=tmp_path,
        timeout_s=240.0,
        round_timeout_s=25.0,
        quorum_fraction=0.6,  # 14 honest of 20 at N = 20 (one hostile robot of each kind)
    )
    assert faulty.completed and clean.completed
    plan = fault_plan(N)
    honest = [k for k, f in plan.items() if f in ("", "storm")]
    assert faulty.updates_accepted == len(honest) == clean.updates_accepted
    assert faulty.accepted_robots == sorted(f"robot_{k}" for k in honest)
    # The server refused each hostile update with its reason's code; the forged signature is
    # dropped unanswered (it cannot be told from a stranger's), and none was used.
    assert {plan[int(rid[6:])]: code for rid, code in faulty.rejected_codes.items()} == {
        "shape": "schema",
        "nan": "non_finite",
        "oversized": "schema",
    }
    assert faulty.storm_calls == 10 and faulty.storm_accepted == 10
    assert len(clean.robot_digests) == len(honest) and differ == []
    assert faulty.ari == pytest.approx(1.0)
    # The hostile updates were refused before they could grow the server (20 % head-room).
    assert faulty.server_peak_rss_mb <= 1.2 * clean.server_peak_rss_mb
