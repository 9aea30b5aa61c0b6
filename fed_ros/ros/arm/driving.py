"""A robot node's arm work over ROS: scripted-expert demonstrations (recorded), the Record
service, local demonstrations on disk, and closed-loop policy rollouts. Helpers over an
`ArmClient` and a `Recorder`; the node holds the arm lock while they drive."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Callable, Sequence

log = logging.getLogger("fed_ros.ros.arm.driving")


def attach_arm(
    node,
    demo_dir: Path,
    *,
    namespace: str,
    robot_id: str,
    cameras: bool,
    camera_transport: str,
    image_size: int,
    callback_group,
) -> tuple[Any, Any]:
    """A robot node's two views of its arm, on the arm's topics under ``namespace``: the
    ArmClient that drives it (as the policy) and the Recorder that records demonstrations into
    ``demo_dir``. Both read the same cameras, at the policy's image size."""
    from fed_ros.ros.arm.arm_client import ArmClient
    from fed_ros.ros.arm.recorder import Recorder

    cams = dict(cameras=cameras, camera_transport=camera_transport, image_size=image_size)
    arm = ArmClient(
        node, namespace=namespace, source="policy", callback_group=callback_group, **cams
    )
    recorder = Recorder(
        node,
        demo_dir,
        namespace=namespace,
        robot_id=robot_id,
        callback_group=callback_group,
        **cams,
    )
    return arm, recorder


def record_expert_demos(
    arm: Any,
    recorder: Any,
    tasks: Sequence[str],
    count: int,
    first_index: int,
    *,
    demo_seed: int,
    noise_std: float,
    variation: str,
    max_steps: int,
    info: Callable[[str], None] = log.info,
    error: Callable[[str], None] = log.error,
) -> int:
    """Drive the arm with the scripted expert and record each episode; returns the successes."""
    from fed_ros.sim.collect import STREAM_COLLECT, episode_seed
    from fed_ros.sim.experts import make_expert

    arm.wait_for_arm(60.0)
    t0 = time.monotonic()
    ok = 0
    index = first_index
    attempts = 0
    # Failed demonstrations are kept on disk but never trained on; retry up to 2x.
    while ok < count and attempts < 2 * count + 2:
        task = tasks[index % len(tasks)]
        seed = episode_seed(demo_seed, index, STREAM_COLLECT)
        # The expert commands in this arm's frame (a mirrored mount negates x/y) and labels
        # its commands expert:<name>, so the recording says which code drove every step.
        expert = make_expert(task, noise_std=noise_std, seed=seed, variation=variation)
        instruction, episode = arm.reset(task, variation, seed)
        recorder.start(task, instruction, variation, source=expert.source)
        try:
            outcome = arm.run_episode(
                expert, episode, timeout=300.0, max_steps=max_steps, source=expert.source
            )
        except (
            BaseException
        ):  # interrupted (learning off, shutdown): a cut-short demonstration is no data
            recorder.discard()
            raise
        try:
            # The arm applied outcome.steps commands: wait for exactly those (not a time window).
            result = recorder.stop(
                outcome.success, expected_steps=None if outcome.timed_out else outcome.steps
            )
            ok += int(result.success)
        except ValueError as exc:
            error(f"demonstration {index}: recording unusable: {exc}")
        index += 1
        attempts += 1
        info(
            f"demonstration {index} ({task}, seed {seed}): "
            f"{'success' if outcome.success else 'failure'} in {outcome.steps} steps"
        )
    info(
        f"recorded {ok}/{count} successful demonstrations over ROS in {time.monotonic() - t0:.1f} s"
    )
    return ok


def run_policy(
    arm: Any,
    runner: Any,
    tasks: Sequence[str],
    variation: str,
    episodes: int,
    seed: int,
    max_steps: int,
    source: str | None = None,
    handover: Any = None,
    tally: Any = None,
) -> dict[str, float]:
    """Closed-loop success rate per task of ``runner`` on the arm (seeded resets).

    ``source`` labels the commands (e.g. ``policy:<model sha256 prefix>``); ``handover`` is told
    of each human takeover (:mod:`fed_ros.ros.arm.interventions`); ``tally`` (an
    ``InterventionTally``) adds each episode's takeovers and human seconds.
    """
    from fed_ros.sim.collect import STREAM_EVALUATE, episode_seed

    arm.wait_for_arm(60.0)
    rates = {}
    for task in tasks:
        wins = 0
        for i in range(episodes):
            _, episode = arm.reset(task, variation, episode_seed(seed, i, STREAM_EVALUATE))
            outcome = arm.run_episode(
                runner, episode, 300.0, max_steps, source=source, handover=handover
            )
            wins += int(outcome.success)
            if tally is not None:
                tally.add_episode(outcome.interventions, outcome.human_seconds)
        rates[task] = wins / episodes
    return rates


class InputTally:
    """Wraps a policy (``reset`` / ``act``) and counts what it was fed: steps, and steps that
    carried both camera images with their shape. The robot node logs it with each evaluation,
    so a record shows whether a closed loop ran on the arm's camera topics."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy
        self.source = getattr(policy, "source", None)
        self.steps = 0
        self.camera_steps = 0
        self.image_shape: list[int] = []

    def reset(self) -> None:
        self.policy.reset()

    def act(self, obs: dict) -> Any:
        from fed_ros.core.data.episode import IMAGE_KEYS

        self.steps += 1
        if all(obs.get(k) is not None for k in IMAGE_KEYS):
            self.camera_steps += 1
            self.image_shape = [int(d) for d in obs[IMAGE_KEYS[0]].shape]
        return self.policy.act(obs)

    def summary(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "camera_steps": self.camera_steps,
            "image_shape": self.image_shape,
        }


def local_episodes(
    demo_dir: Path, warn: Callable[[str], None] = log.warning, set_bad_aside: bool = True
) -> list:
    """Successful demonstrations: ROS recordings under ``demo_dir`` plus Episode .npz files there.

    One that cannot be read (a truncated MCAP, an episode file cut short, a recording refused
    at STOP) is quarantined with its reason (fed_ros.core.data.quarantine) and skipped: one bad
    file costs one episode, never the robot's round. ``warn`` is told once, as it moves.
    ``set_bad_aside=False`` (a read-only reader such as ``fed-ros dataset export``) only skips
    it, with a warning, and leaves the robot's folder as it was.
    """
    from fed_ros.core.data.episode import Episode
    from fed_ros.ros.arm.recorded_episodes import (
        recording_dirs,
        recording_succeeded,
        recording_to_episode,
    )

    def load_recording(path: Path) -> Any:
        return recording_to_episode(path) if recording_succeeded(path) else None

    episodes = []
    loads = [(path, load_recording) for path in recording_dirs(demo_dir)]
    loads += [(path, Episode.load) for path in sorted(demo_dir.glob("*.npz"))]
    for path, load in loads:
        try:
            episode = load(path)
        except Exception as exc:  # noqa: BLE001 - a corrupt file raises whatever its reader does
            reason = f"{type(exc).__name__}: {exc}"
            if set_bad_aside:
                set_aside(path, demo_dir, reason, warn)
            else:
                warn(f"demonstration {path.name} skipped: {reason}")
            continue
        if episode is not None and episode.success:
            episodes.append(episode)
    return episodes


def set_aside(path: Path, demo_dir: Path, reason: str, warn: Callable[[str], None]) -> Path | None:
    """Quarantine a demonstration that cannot be trained on and say so once."""
    from fed_ros.core.data.quarantine import quarantine

    try:
        where = quarantine(path, reason, demo_dir)
    except OSError as exc:  # a read-only folder: still skipped, and said so at every load
        warn(f"demonstration {path.name} skipped, could not be quarantined ({exc}): {reason}")
        return None
    if where is not None:
        warn(f"demonstration {path.name} quarantined in {where.parent} ({reason})")
    return where


def answer_record(recorder: Any, request: Any, response: Any, task: str, variation: str) -> Any:
    """The Record service (teleop): START / STOP / DISCARD a demonstration; errors become
    messages."""
    from fed_ros.srv import Record

    try:
        if request.command == Record.Request.START:
            path = recorder.start(
                request.task or task, request.instruction, request.variation or variation
            )
            response.ok, response.message, response.episode_path = True, "recording", str(path)
        elif request.command == Record.Request.STOP:
            result = recorder.stop(bool(request.success))
            response.ok, response.episode_path = True, str(result.path)
            response.num_steps = int(result.num_steps)
            response.message = "saved" if result.success else "saved as failed (never trained on)"
        elif request.command == Record.Request.DISCARD:
            path = recorder.discard()
            response.ok, response.message = (
                True,
                f"discarded {path}" if path else "nothing to discard",
            )
        else:
            response.ok, response.message = False, f"unknown Record command {request.command}"
    except (ValueError, RuntimeError) as exc:
        response.ok, response.message = False, str(exc)
    return response
