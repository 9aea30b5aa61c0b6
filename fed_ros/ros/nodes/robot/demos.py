"""A robot's demonstrations: what it has on disk, what it still needs, and the start-up collection.

The Record service (teleop: START / STOP / DISCARD a demonstration) is answered here too.

Demonstrations are ROS recordings under ``demos/`` plus Episode ``.npz`` files there (only the
successful ones are trained on). A robot trains once it has ``min_demos`` of them; before that
it answers TRAIN / DESCRIBE / SCORE with "waiting for demonstrations (have k of N)", which its
/diagnostics status shows too. A new arm with none is an expected state, not an error.

``collect_demos_on_start`` (sim fleets, a lab's scripted expert) records demonstrations with
the scripted expert over ROS before the robot registers. Learning switched off mid-episode
stops the arm (:class:`fed_ros.ros.arm.arm_client.EpisodeInterrupted`); the rest is collected
once learning is on again.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable

from fed_ros.ros.arm.arm_client import EpisodeInterrupted


class RobotDemonstrations:
    """The demonstrations of one robot (``demo_dir``) and the arm work that records them.

    Collaborators: ``params`` returns the robot's current parameters (RobotParams, live),
    ``arm``/``recorder`` drive and record the arm, ``arm_lock`` is held while driving, ``gate``
    is the learning gate, ``log`` the node's logger.
    """

    def __init__(
        self,
        demo_dir: Path,
        params: Callable[[], Any],
        arm: Any,
        recorder: Any,
        arm_lock: threading.Lock,
        gate: Any,
        log: Any,
    ) -> None:
        self.demo_dir = demo_dir
        self._params, self.arm, self.recorder = params, arm, recorder
        self.arm_lock, self.gate, self.log = arm_lock, gate, log
        self.waiting = (
            ""  # what status() said last (read by /diagnostics, which must not read the disk)
        )

    def episodes(self) -> list:
        """Successful demonstrations: ROS recordings under demos/ plus Episode .npz files there."""
        from fed_ros.ros.arm.driving import local_episodes

        return local_episodes(self.demo_dir, warn=self.log.warning)

    def status(self) -> str:
        """'' when the robot has the demonstrations it needs to train, else what it waits for."""
        have, need = len(self.episodes()), self._params().min_demos
        self.waiting = "" if have >= need else f"waiting for demonstrations (have {have} of {need})"
        return self.waiting

    def answer_record(self, request: Any, response: Any, task: str) -> Any:
        """The Record service (teleop) for ``task``: START / STOP / DISCARD a demonstration; after
        a STOP, the status says whether the robot still waits for demonstrations."""
        from fed_ros.ros.arm.driving import answer_record
        from fed_ros.srv import Record

        response = answer_record(self.recorder, request, response, task, self._params().variation)
        if request.command == Record.Request.STOP:
            self.status()
        return response

    def collect_on_start(self, stop: threading.Event) -> None:
        """Record ``collect_demos_on_start`` demonstrations (minus those on disk) while learning is
        on."""
        wanted = self._params().collect_demos_on_start
        while wanted:
            have = len(self.episodes())
            if have >= wanted or not self.gate.wait(stop):
                break
            try:
                self.collect(wanted - have, first_index=have)
                break
            except EpisodeInterrupted as exc:  # learning switched off: the rest once it is on again
                self.log.info(f"demonstrations: {exc}")
        if self.status():
            self.log.info(
                f"{self.waiting}: record some (the Record service); training starts once there are "
                "enough"
            )

    def collect(self, count: int, first_index: int = 0) -> None:
        """Drive the arm with the scripted expert over ROS and record each episode (the ROS
        path)."""
        from fed_ros.ros.arm.driving import record_expert_demos

        p = self._params()
        self.log.info(
            f"recording {count} demonstration(s): the scripted expert drives the arm over ROS"
        )
        with self.arm_lock:
            record_expert_demos(
                self.arm,
                self.recorder,
                p.tasks,
                count,
                first_index,
                demo_seed=p.demo_seed,
                noise_std=p.demo_noise_std,
                variation=p.variation,
                max_steps=p.max_episode_steps,
                info=self.log.info,
                error=self.log.error,
            )
