"""The arm adapter's control loop: policy commands in, safety-filtered commands out, every stop.

Each tick the safety filter (:mod:`fed_ros.core.arm.safety`) turns the newest policy command
into what is sent (clipped, workspace box, watchdog, hold); the applied command is published
stamped with the observation it answered, a step is counted when the observation it answers
was published, and the newest arm state goes out under one new tick stamp
(:class:`~fed_ros.ros.nodes.arm_adapter.observations.ObservationPublisher`). A command answering the
current observation goes to the arm at once. Every stop path (e-stop, the policy's HOLD, a
fault in the loop, the watchdog, shutdown) ends in :meth:`ArmControlLoop.stop_arm` or its zero,
sent under the lock every tick takes, so no command computed before it can follow it
(:mod:`fed_ros.ros.nodes.arm_adapter.stop_paths`). Everything here runs under that one lock; the
node (:mod:`fed_ros.ros.nodes.arm_adapter.arm_adapter_node`) only wires callbacks to it.
"""

from __future__ import annotations

import threading
from typing import Callable

import numpy as np

from fed_ros.core.arm.interventions import is_teleop
from fed_ros.core.arm.profile import ArmProfile
from fed_ros.core.arm.safety import MODE_HOLD, SafetyFilter, TickOutput
from fed_ros.core.arm.state import ArmStateStore
from fed_ros.core.arm.ticks import TickSchedule
from fed_ros.ros.arm import topics as at
from fed_ros.ros.nodes.arm_adapter.episode import AdapterEpisode
from fed_ros.ros.nodes.arm_adapter.observations import ObservationPublisher
from fed_ros.ros.nodes.arm_adapter.arm_commands import ArmCommandOutput


class ArmControlLoop:
    """Ticks, policy commands and stops of one arm, all under ``lock``.

    ``clock`` is the monotonic clock every time read goes through (the node's, so tests can
    drive it with a fake one); ``logger`` the node's.
    """

    def __init__(
        self,
        profile: ArmProfile,
        lock: threading.RLock,
        safety: SafetyFilter,
        state: ArmStateStore,
        commands: ArmCommandOutput,
        observations: ObservationPublisher,
        episode: AdapterEpisode,
        logger,
        clock: Callable[[], float],
    ) -> None:
        self.profile, self.lock, self.safety, self.state = profile, lock, safety, state
        self.commands, self.observations, self.episode = commands, observations, episode
        self.lockstep = state.lockstep
        self._logger, self._clock = logger, clock
        self._ticks = TickSchedule(profile.period_s)  # follows the arm's cycle (core.arm.ticks)
        self.overruns = 0
        self.stopped = ""  # why the arm was stopped for good (shutdown): nothing moves it again
        self._zeroed_trips = 0  # watchdog trips answered with the full zero
        self.source = "policy"  # ArmCommand.source of the command in effect (applied commands)

    # ------------------------------------------------------------------ policy commands in
    def on_command(self, msg) -> None:
        hold = int(msg.mode) == MODE_HOLD
        with self.lock:
            # A human at a teleop device takes over from the policy with the deadman; while
            # the human drives, the policy's commands are dropped (core.arm.interventions).
            control, now = self.episode.control, self._clock()
            human_before = control.human_active(now)
            if not control.admit(msg.source, hold, now):
                return
            handed_back = human_before and not control.human_active(now)
            reason = self.safety.command(
                np.asarray(msg.action), float(msg.gripper), int(msg.mode), self._clock()
            )
            if not reason:
                self.source = msg.source or "policy"  # who produced the command in effect
        if reason and reason != "hold requested":
            self._logger.warning(
                f"ArmCommand refused ({self.safety.counters.rejected} so far): {reason}; holding",
                throttle_duration_sec=1.0,
            )
        if not reason and hold:
            # The policy side stops the arm (its node shutting down, learning switched off):
            # the zero goes at once, whatever observation the HOLD answers.
            with self.lock:
                self._send_zero()
                if is_teleop(msg.source) and (
                    self._answers_current(msg) or (handed_back and self._running_unanswered())
                ):
                    # A human's HOLD (deadman released) also answers the observation, so a
                    # lockstep arm steps (still) and the policy, in control again, gets a fresh
                    # observation to act on. The HOLD that hands back answers the current one
                    # whatever it is stamped with: under load the teleop's newest observation
                    # was one behind, its HOLD answered nothing, and the lockstep arm waited for
                    # an answer the policy never gave (its status still said human control).
                    self._guarded(self._apply, self._clock(), answer=True)
            return
        # A command answering the current observation goes to the arm at once (no wait for
        # the next tick: one tick less latency, as a teleoperated Servo would see it).
        with self.lock:
            if self._answers_current(msg):
                self._guarded(self._apply, self._clock(), answer=True)

    def _answers_current(self, msg) -> bool:
        """Whether ``msg`` answers the current, unanswered observation of a running episode."""
        return at.stamp_to_ns(msg.header.stamp) == self.observations.stamp_ns and (
            self._running_unanswered()
        )

    def _running_unanswered(self) -> bool:
        """Whether a running episode's current observation still waits for its answer."""
        return (
            self.observations.stamp_ns > 0
            and not self.observations.answered
            and not self.episode.done
            and not self.episode.resetting
        )

    def _hand_back_silently(self, now: float) -> None:
        """A lockstep arm's human went silent (a teleop that died with its deadman held):
        the arbiter handed back after ``handback_s``, but the arm makes no ticks of its own and
        the observation waiting for an answer says the human drives. A fresh one (same arm
        state, new stamp) says the policy does, so the policy answers it and the arm steps."""
        if (
            self.observations.human_control
            and self._running_unanswered()
            and not self.episode.control.human_active(now)
        ):
            self.publish_observation(now)

    def on_hold(self, msg) -> None:
        if msg.data:
            self.stop_arm("e-stop (arm/hold true)")  # at once, not at the next tick
            return
        with self.lock:
            if self.stopped:
                self._logger.warning(
                    f"hold release ignored: the arm is stopped for good ({self.stopped})"
                )
                return
            self.safety.hold(False)
        self._logger.warning("hold released")

    # ------------------------------------------------------------------ stop paths
    def stop_arm(self, reason: str, final: bool = False) -> None:
        """Latch the hold and send the arm a zero command now; every stop path ends here.

        The zero is a zero twist, zero joint velocities (the current positions on a position
        interface) and the gripper held at its last commanded position (not the measured one,
        which a grasp holds short of closed: sending it would loosen the grasp). It is sent under
        the lock every tick takes, so no command computed before it can follow it. ``final``
        (shutdown): the latch is never released again, not by a reset nor by ``arm/hold false``.
        """
        with self.lock:
            self.safety.hold(True)
            if final:
                self.stopped = self.stopped or reason
            self._send_zero()
        self._logger.warning(f"arm stopped: {reason}; zero command sent")

    def _send_zero(self) -> None:
        """One zero command on every command topic of the arm (caller holds the lock)."""
        joints = self.state.current("joints", self._clock())
        self.commands.send_zero(self.safety.last_gripper, None if joints is None else joints[0])

    def _send(self, out: TickOutput, stamp_ns: int, answer: bool = False) -> None:
        """Publish one tick's arm commands; in lockstep the gripper goes with every answer
        (held: in place)."""
        gripper = (
            out.gripper
            if out.gripper is not None or not (answer and self.lockstep)
            else out.applied_gripper
        )
        joints = self.state.current("joints", self._clock()) if out.kind == "joint" else None
        self.commands.send(out, stamp_ns, gripper, None if joints is None else joints[0])

    # ------------------------------------------------------------------ ticks
    def on_arm_state(self, pose_stamp_ns: int) -> None:
        """An arm state that makes a tick
        (:class:`~fed_ros.ros.nodes.arm_adapter.arm_inputs.ArmInputs`).

        A lockstep arm re-sending the state of the current observation makes none: it waits
        for the answer, so that observation goes out again when still unanswered.
        """
        if not self.lockstep or pose_stamp_ns != self.observations.arm_stamp_ns:
            self.on_tick(from_timer=False)
        elif not self.episode.resetting:
            self.observations.resend_unanswered()

    def on_tick(self, from_timer: bool) -> None:
        self._guarded(self._tick, from_timer)

    def _apply(self, now: float, answer: bool = False) -> None:
        """Send this tick's command through the safety filter and record it as applied."""
        pose = self.state.current("pose", now)
        out = self.safety.tick(now, None if pose is None else pose[0])
        trips = self.safety.watchdog.trips
        if out.reason.startswith("watchdog") and trips != self._zeroed_trips:
            # The policy went silent (its node died): the full zero, once per trip.
            self._zeroed_trips = trips
            self._send_zero()
        # A step needs the arm state of this tick: with a stale state nothing is applied.
        fresh = pose is not None and self.state.current("joints", now) is not None
        active = not self.episode.done and self.observations.stamp_ns > 0 and fresh
        if not active:
            out = TickOutput("hold", applied_gripper=out.applied_gripper, reason="no episode")
        self._send(out, self.observations.arm_stamp_ns, answer)
        if active and not self.observations.answered:
            self.observations.publish_applied(out, self.source)

    def _guarded(self, step, *args, **kwargs) -> None:
        """Run one step of the control loop (a tick, or applying a command); any fault stops
        the arm."""
        try:
            step(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - any fault in the control loop stops the arm
            # The hold stays latched until an operator releases it (arm/hold false) or a reset
            # starts the next episode: a loop that failed once is not trusted to move the arm.
            self._logger.error(f"control tick failed ({type(exc).__name__}: {exc}): holding")
            self.stop_arm(f"control tick failed: {type(exc).__name__}")

    def _tick(self, from_timer: bool) -> None:
        start = self._clock()
        with self.lock:
            if self.lockstep and from_timer:
                # A lockstep arm is silent while it waits: only its states make ticks.
                self._hand_back_silently(start)
                return
            if not self.lockstep:
                # The arm drives the ticks, at most control_rate_hz; the timer covers silences.
                if not self._ticks.take(start, from_timer):
                    return
                self.overruns = self._ticks.overruns
            if self.episode.resetting:
                return  # the home trajectory owns the arm
            was_active = not self.episode.done and self.observations.stamp_ns > 0
            if not self.lockstep:  # lockstep: the arm moves only on an answer, nothing to repeat
                self._apply(start)  # repeats the command in effect (what Servo keeps executing)
            before = (self.episode.step, self.episode.done)
            if was_active and self.observations.answered:
                self.episode.advance()
            if not self.publish_observation(start):
                # A step is an observation and its answer: with a stale state none was taken
                # (counting it anyway skipped step numbers and cut recordings short).
                self.episode.step, self.episode.done = before

    def publish_observation(self, now: float) -> bool:
        """Re-publish the newest arm state under one new tick stamp with its EpisodeStatus;
        False when it is stale."""
        return self.observations.publish(self.state, now, self.episode, self.overruns)
