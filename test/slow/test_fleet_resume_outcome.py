"""Resume checked by its outcome (issue 17 item 1): real robot node processes train on the models
the server sends; the real server process is SIGKILLed at three points of a round and restarted,
and the federation must end with the cluster models of the same fleet run without interruption.

The fleet is the benchmark-equivalence fleet (test_fleet_bench_equivalence.py): 2 robots, low-dim
policy, fixed demos written as Episode .npz into each robot's data dir (no simulator, no
evaluation), seeded, 10 local steps a round. The server kills itself by SIGKILL at a named step
(FED_ROS_CRASH_AT, fed_ros/core/rounds/faults.py), one kill per server incarnation, robots stay up:

1. ``update_accepted@1#2``   every round-1 update accepted and acknowledged, nothing aggregated;
2. ``written:manifest@2``   round 2 aggregated, its files written, its manifest not in place
                              (between aggregation and the commit point);
3. ``committed@2``           the last round committed, its models/report/DONE not yet published.

Required: bit-identical final cluster models (same float path: same seeds, same updates, the
participants' fixed order in FedAvg), the store's last committed round is ROUNDS-1 and no round
ROUNDS is ever announced (no extra round after the last), and each robot trains each round exactly
once: a re-announced round is answered with the cached update (the robot node's Outbox), never
retrained.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from support.resume_fleet import (
    ROBOTS,
    ROUNDS,
    _final,
    _robot_log,
    _run_fleet,
    assert_same_final_models,
)

KILLS = (  # (FED_ROS_CRASH_AT, last committed round after the kill)
    ("update_accepted@1#2", 0),
    (f"written:manifest@{ROUNDS - 1}", ROUNDS - 2),
    (f"committed@{ROUNDS - 1}", ROUNDS - 1),
)


def _updates_sent(run_dir: Path, rid: str) -> dict[int, set[str]]:
    """Round -> sha256 of every update the robot sent for it (its transfers.jsonl)."""
    sent: dict[int, set[str]] = {}
    for line in (run_dir / rid / "transfers.jsonl").read_text().splitlines():
        entry = json.loads(line)
        if entry.get("kind") == "update_sent":
            sent.setdefault(int(entry["round"]), set()).add(entry["sha256"])
    return sent


@pytest.mark.ros
@pytest.mark.timeout(900)
def test_server_killed_before_aggregation_mid_commit_and_after_last_round_ends_like_uninterrupted(
    tmp_path, ros_env, processes, torch_one_thread
):
    reference_dir, crashed_dir = tmp_path / "uninterrupted", tmp_path / "crashed"
    _run_fleet(reference_dir, ros_env, processes)
    reference = _final(reference_dir)
    processes.kill_all()  # the reference robots are done; the crashed fleet starts from scratch
    server_logs = _run_fleet(crashed_dir, ros_env, processes, crash_at=KILLS)

    # 1. Same outcome: bit-identical cluster models (and memberships) of the last round.
    assert_same_final_models(reference, _final(crashed_dir))
    # 2. No extra round after the last: nothing committed or announced for round ROUNDS.
    assert not (crashed_dir / "server" / f"round_{ROUNDS:08d}").exists()
    logs = [p.read_text() for p in server_logs]
    assert all(f"announced round {ROUNDS} stage train" not in text for text in logs)
    assert f"announced round {ROUNDS} stage done" in logs[-1]
    assert "resumed after committed round" in logs[1]
    # 3. Each robot trained each round once; re-announced rounds got the cached update again.
    for rid in ROBOTS:
        text = _robot_log(crashed_dir, rid)
        for r in range(ROUNDS):
            assert text.count(f"round {r}: trained ") == 1, (rid, r, text[-3000:])
        for r in (1, ROUNDS - 1):  # re-announced after kills 1 and 2
            assert f"round {r}: re-sent the update already trained" in text, (rid, r)
        sent = _updates_sent(crashed_dir, rid)
        assert all(len(shas) == 1 for shas in sent.values()), (
            rid,
            sent,
        )  # re-sent bytes = trained bytes
        assert sent == _updates_sent(reference_dir, rid), (
            rid
        )  # and the same updates as the uninterrupted run


def test_crash_hook_kills_at_the_nth_time_a_step_of_a_round_is_reached():
    import os
    from fed_ros.core.rounds import faults

    assert faults.parse("update_accepted@1#2, written:manifest@2") == [
        ("update_accepted", 1, 2),
        ("written:manifest", 2, 1),
    ]
    with pytest.raises(ValueError):
        faults.parse("no_round")
    faults.reach("committed", 0, environ={})  # off without FED_ROS_CRASH_AT
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: reaches the step twice for another round, then twice for round 1
        os.close(read_end)
        env = {faults.ENV: "committed@1#2"}
        for r in (0, 0, 1):
            faults.reach("committed", r, environ=env)
        os.write(write_end, b"alive")  # still alive after the first reach of round 1
        faults.reach("committed", 1, environ=env)
        os._exit(0)
    os.close(write_end)
    _, status = os.waitpid(pid, 0)
    assert os.read(read_end, 16) == b"alive"
    os.close(read_end)
    assert os.waitstatus_to_exitcode(status) == -signal.SIGKILL
