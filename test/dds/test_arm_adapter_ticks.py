"""The arm adapter's step rule with a starved lockstep simulator (in process, fake clock).

A step is one observation published and one applied command answering it. When the
simulator process is starved (a loaded machine), the parts of one arm state arrive far apart
in wall time. The adapter must neither count a step it published no observation for (the
episode statuses would skip step numbers and the recording would come up short) nor call a
lockstep arm's state stale: a lockstep arm waits for the answer, so its last state is its
state however long the answer takes.
"""

from __future__ import annotations


from support.adapter_ticks import _arm_state, _start_episode


def _answer(node) -> None:
    """The policy's command answering the adapter's current observation."""
    from fed_ros.msg import ArmCommand
    from fed_ros.ros.arm import topics as at

    cmd = ArmCommand()
    cmd.header.stamp = at.ns_to_stamp(node.observations.stamp_ns)
    cmd.action = [0.1, 0.0, 0.0]
    cmd.gripper = -1.0
    node.control.on_command(cmd)


def _run(node, clock, delays: list[float]) -> list[tuple[int, int, int]]:
    """Answer each observation, then the next arm state arrives; (step, obs stamp, applied
    stamp)."""
    seen = []
    for i, delay in enumerate(delays):
        _answer(node)
        obs = node.observations
        assert obs.applied_ns == obs.stamp_ns, "the answer was not applied"
        clock.t += 0.05
        _arm_state(node, clock, 2_000_000_000 + i * 50_000_000, pose_delay_s=delay)
        seen.append((node.episode.step, obs.stamp_ns, obs.applied_ns))
    return seen


def test_every_step_has_its_observation_when_arm_state_parts_arrive_slowly(adapter):
    node, clock = adapter
    _start_episode(node, clock)
    # Cycles 3 and 4: the simulator was starved between its joint_states and its pose
    # (longer than state_timeout_s, 0.5 s).
    seen = _run(node, clock, [0.0, 0.0, 0.8, 0.9, 0.0, 0.0])
    steps = [s for s, _, _ in seen]
    stamps = [o for _, o, _ in seen]
    if node.lockstep:
        # The paused arm's state is current however late its last part came: every cycle is a step.
        assert steps == [1, 2, 3, 4, 5, 6], f"step numbers skipped or repeated: {steps}"
        assert len(set(stamps)) == len(stamps), "a step was counted without a new observation"
    else:
        # A free-running arm's stale state is no observation, and no step either.
        assert steps == [1, 2, 2, 2, 3, 4], f"step numbers skipped or repeated: {steps}"
        assert stamps[2] == stamps[3] == stamps[1] and len(set(stamps)) == 4, stamps
