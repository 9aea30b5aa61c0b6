"""A bad demonstration costs one episode, never the robot (issue 36, recording path).

A truncated MCAP, an episode file cut to half its steps or a cut episode cache beside good
recordings: ``local_episodes`` (what a robot trains on) skips the bad file and moves it into
``demos/quarantine`` with its reason, once. A recording of an arm that never moved is refused.
A 2-robot fleet with quorum 1.0 and one bad file per robot still completes its round with both
updates.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from fed_ros.core.data.episode import Episode
from fed_ros.core.data.quarantine import QUARANTINE_DIR, REASON_SUFFIX, quarantine
from fed_ros.learning.dataset import synthetic_episodes
from fed_ros.ros.arm.driving import local_episodes
from fed_ros.ros.arm.recorded_episodes import (
    EPISODE_CACHE,
    RecordingError,
    load_recorded_episodes,
    recording_to_episode,
)

from support.recordings import synthetic_ticks, write_bag


def truncate_mcap(recording: Path) -> Path:
    """Cut a recording's MCAP file to half its bytes (a disk filled or power lost mid-write)."""
    [mcap] = recording.glob("*.mcap")
    data = mcap.read_bytes()
    mcap.write_bytes(data[: len(data) // 2])
    return recording


def cut_to_half_steps(path: Path) -> Path:
    """Rewrite an episode file with its actions cut to half its steps (observations whole)."""
    with np.load(path, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    arrays["actions"] = arrays["actions"][: len(arrays["actions"]) // 2]
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    return path


def reason_of(quarantined: Path) -> str:
    return quarantined.with_name(quarantined.name + REASON_SUFFIX).read_text()


def test_a_truncated_mcap_beside_good_recordings_is_quarantined_once(tmp_path, caplog):
    write_bag(tmp_path / "good_a", synthetic_ticks(4, seed=1))
    truncate_mcap(write_bag(tmp_path / "bad", synthetic_ticks(6, seed=2)))
    write_bag(tmp_path / "good_b", synthetic_ticks(5, seed=3))
    with caplog.at_level(logging.WARNING, logger="fed_ros.ros.arm.driving"):
        episodes = local_episodes(tmp_path)
    assert sorted(len(e) for e in episodes) == [4, 5]
    assert not (tmp_path / "bad").exists()
    moved = tmp_path / QUARANTINE_DIR / "bad"
    assert (moved / "metadata.yaml").is_file() and str(tmp_path / "bad") in reason_of(moved)
    [warning] = [r.getMessage() for r in caplog.records if "quarantined" in r.getMessage()]
    assert warning.startswith(f"demonstration bad quarantined in {tmp_path / QUARANTINE_DIR} (")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fed_ros.ros.arm.driving"):
        again = local_episodes(tmp_path)  # the quarantine is never read again: no new warning
    assert sorted(len(e) for e in again) == [4, 5] and not caplog.records
    assert len(load_recorded_episodes(tmp_path)) == 2  # nor by any other loader


def test_an_episode_file_cut_to_half_its_steps_is_quarantined_with_its_reason(tmp_path):
    first, second = synthetic_episodes(2, length=10, seed=4)
    first.save(tmp_path / "a.npz")
    cut_to_half_steps(second.save(tmp_path / "b.npz"))
    torn = tmp_path / "c.npz"
    data = first.save(torn).read_bytes()
    torn.write_bytes(data[: len(data) // 2])  # cut mid-file
    write_bag(tmp_path / "rec", synthetic_ticks(3))
    episodes = local_episodes(tmp_path)
    assert sorted(len(e) for e in episodes) == [3, 10]
    assert "has 10 steps but actions have 5" in reason_of(tmp_path / QUARANTINE_DIR / "b.npz")
    assert (tmp_path / QUARANTINE_DIR / "c.npz").is_file()
    assert sorted(p.name for p in tmp_path.glob("*.npz")) == ["a.npz"]


def test_a_cut_episode_cache_is_rebuilt_from_its_recording_not_quarantined(tmp_path):
    path = write_bag(tmp_path / "rec", synthetic_ticks(6, seed=5))
    expected = recording_to_episode(path)  # writes the cache
    cut_to_half_steps(path / EPISODE_CACHE)
    [episode] = local_episodes(tmp_path)
    np.testing.assert_array_equal(episode.actions, expected.actions)
    assert len(Episode.load(path / EPISODE_CACHE)) == 6  # rebuilt whole
    assert not (tmp_path / QUARANTINE_DIR).exists()


def test_a_success_in_which_the_arm_never_moved_is_refused_naming_it(tmp_path):
    ticks = [
        (stamp, obs, np.array([0, 0, 0, -1], np.float32)) for stamp, obs, _ in synthetic_ticks(8)
    ]
    path = write_bag(tmp_path / "still", ticks)
    with pytest.raises(RecordingError, match=r"still: the arm never moved: all 8 applied"):
        recording_to_episode(path)
    assert not (path / EPISODE_CACHE).exists()
    # Labelled a failure it is kept as recorded (never trained on); one moving step is motion.
    failed = write_bag(tmp_path / "failed", ticks, success=False)
    assert len(recording_to_episode(failed, allow_failed=True)) == 8
    ticks[3] = (ticks[3][0], ticks[3][1], np.array([0, 0, 0, 1], np.float32))  # gripper closes
    assert len(recording_to_episode(write_bag(tmp_path / "grip", ticks))) == 8
    assert [len(e) for e in local_episodes(tmp_path)] == [8]
    assert "the arm never moved" in reason_of(tmp_path / QUARANTINE_DIR / "still")


def test_quarantine_keeps_both_copies_of_a_name_and_needs_a_reason(tmp_path):
    for text in ("first", "second"):
        (tmp_path / "x.npz").write_text(text)
        quarantine(tmp_path / "x.npz", f"reason {text}", tmp_path)
    kept = sorted(p.name for p in (tmp_path / QUARANTINE_DIR).iterdir())
    assert kept == ["x.npz", "x.npz.2", "x.npz.2.reason.txt", "x.npz.reason.txt"]
    assert "reason second" in reason_of(tmp_path / QUARANTINE_DIR / "x.npz.2")
    assert quarantine(tmp_path / "gone.npz", "vanished", tmp_path) is None
    (tmp_path / "y.npz").write_text("y")
    with pytest.raises(ValueError, match="needs a reason, got ''"):
        quarantine(tmp_path / "y.npz", "", tmp_path)


# --- a fleet over real DDS ----------------------------------------------------------------


@pytest.mark.ros
@pytest.mark.timeout(300)
def test_a_fleet_round_completes_with_a_bad_file_beside_each_robots_demos(
    tmp_path, ros_env, processes
):
    from fed_ros.ros.fleet.launcher import fleet_env
    from fed_ros.ros.operator.monitor import FleetMonitor

    from support.fault_fleet import _fleet, _wait

    commands = _fleet(tmp_path, robots=2, rounds=1, quorum_fraction=1.0)
    demos = {rid: tmp_path / rid / "demos" for rid in ("robot_0", "robot_1")}
    truncate_mcap(
        write_bag(demos["robot_0"] / "20261207-031500_robot_0_lift_0001", synthetic_ticks(6))
    )
    cut_to_half_steps(
        synthetic_episodes(1, length=20, seed=9)[0].save(demos["robot_1"] / "cut.npz")
    )
    env = fleet_env(base=ros_env)
    procs = {c.spec.fqn: processes.start(c.argv, env, log_path=c.log_path) for c in commands}
    with FleetMonitor(track_models=False) as monitor:
        _wait(monitor, lambda: bool(monitor.reports), 240, procs, "round 0 report")
    report = monitor.reports[0]
    assert report["completed"] and report["updates_accepted"] == 2, report
    assert all(r["accepted"] for r in report["robots"]), report
    assert (demos["robot_0"] / QUARANTINE_DIR / "20261207-031500_robot_0_lift_0001").is_dir()
    assert "steps but actions have 10" in reason_of(demos["robot_1"] / QUARANTINE_DIR / "cut.npz")
    for rid in demos:
        log = next(c.log_path for c in commands if c.spec.fqn == f"/{rid}/robot").read_text()
        assert log.count("quarantined in") == 1, log[-3000:]


@pytest.mark.ros
@pytest.mark.timeout(240)
def test_a_free_running_arm_nobody_drove_is_refused_and_quarantined(tmp_path, ros_env, processes):
    """A free-running adapter applies a hold every tick: a STOP labelled success after a second
    of them was saved as an episode of hold steps (77-83 in the issue's run) and trained on."""
    from fed_ros.ros.arm.arm_client import ArmClient
    from fed_ros.ros.arm.recorder import Recorder

    from support.arm_adapter_rig import BRIDGE, Spun, _try_reset, start_adapter
    from conftest import wait_until

    ns = "/still_robot"
    bridge = [BRIDGE, "--ros-args", "-r", f"__ns:={ns}", "-r", "__node:=arm"]
    for param in ("interface:=ros2_control", "profile:=panda_sim", "cameras:=false", "task:=lift"):
        bridge += ["-p", param]
    processes.python(["-m", *bridge], ros_env, log_path=tmp_path / "bridge.log")
    start_adapter(
        processes, ros_env, tmp_path / "adapter.log", ns, profile="panda_sim", cameras="false"
    )
    spun = Spun("teaching_station")
    try:
        client = ArmClient(spun.node, namespace=ns, cameras=False, source="teleop")
        recorder = Recorder(spun.node, tmp_path, namespace=ns, robot_id="still", cameras=False)
        client.wait_for_arm(60.0)
        wait_until(lambda: _try_reset(client), 60.0, "the adapter's first reset (arm ready)")
        path = recorder.start("lift", "lift the red cube")
        wait_until(lambda: recorder.num_applied >= 20, 30.0, "20 hold ticks recorded")
        with pytest.raises(RecordingError, match=f"{path.name}: the arm never moved: all"):
            recorder.stop(success=True)
    finally:
        spun.close()
    assert not path.exists() and (tmp_path / QUARANTINE_DIR / path.name).is_dir()
    assert "the arm never moved" in reason_of(tmp_path / QUARANTINE_DIR / path.name)
    assert local_episodes(tmp_path) == []


def test_a_bad_file_that_cannot_be_moved_is_still_skipped_with_a_warning(tmp_path, caplog):
    """A read-only demos folder (or a file named quarantine) must not turn one bad file back
    into a failed round: it is skipped, and said so on every load while it stays."""
    good, cut = synthetic_episodes(2, length=10, seed=7)
    good.save(tmp_path / "good.npz")
    cut_to_half_steps(cut.save(tmp_path / "cut.npz"))
    (tmp_path / QUARANTINE_DIR).write_text("not a folder")
    with caplog.at_level(logging.WARNING, logger="fed_ros.ros.arm.driving"):
        assert [len(e) for e in local_episodes(tmp_path)] == [10]
    [warning] = [r.getMessage() for r in caplog.records]
    assert warning.startswith("demonstration cut.npz skipped, could not be quarantined ([Errno")
    assert warning.endswith("ValueError: observation 'joint_pos' has 10 steps but actions have 5")
    assert (tmp_path / "cut.npz").is_file()


def test_a_read_only_reader_skips_a_bad_file_and_leaves_it_in_place(tmp_path, caplog):
    """``fed-ros dataset export`` reads the demos with ``set_bad_aside=False``: the truncated
    recording is skipped with a warning naming it, and nothing moves."""
    write_bag(tmp_path / "good", synthetic_ticks(4, seed=1))
    truncate_mcap(write_bag(tmp_path / "bad", synthetic_ticks(6, seed=2)))
    with caplog.at_level(logging.WARNING, logger="fed_ros.ros.arm.driving"):
        episodes = local_episodes(tmp_path, set_bad_aside=False)
    assert [len(e) for e in episodes] == [4]
    assert (tmp_path / "bad").is_dir() and not (tmp_path / QUARANTINE_DIR).exists()
    assert any(r.getMessage().startswith("demonstration bad skipped: ") for r in caplog.records)
