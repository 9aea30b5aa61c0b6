"""A robot node driving its own arm over ROS: scripted-expert demonstrations (recorded) and
closed-loop policy rollouts. Pure helpers over an `ArmClient` and a `Recorder`; the node
holds the arm lock while they run."""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Sequence

log = logging.getLogger("fed_ros.ros.arm.driving")


def record_expert_demos(arm: Any, recorder: Any, tasks: Sequence[str], count: int, first_index: int, *,
                        demo_seed: int, noise_std: float, variation: str, max_steps: int,
                        info: Callable[[str], None] = log.info, error: Callable[[str], None] = log.error) -> int:
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
        outcome = arm.run_episode(expert, episode, timeout=300.0, max_steps=max_steps, source=expert.source)
        try:
            # The arm applied outcome.steps commands: wait for exactly those (not a time window).
            result = recorder.stop(outcome.success, expected_steps=None if outcome.timed_out else outcome.steps)
            ok += int(result.success)
        except ValueError as exc:
            error(f"demonstration {index}: recording unusable: {exc}")
        index += 1
        attempts += 1
        info(f"demonstration {index} ({task}, seed {seed}): "
             f"{'success' if outcome.success else 'failure'} in {outcome.steps} steps")
    info(f"recorded {ok}/{count} successful demonstrations over ROS in {time.monotonic() - t0:.1f} s")
    return ok


def run_policy(arm: Any, runner: Any, tasks: Sequence[str], variation: str, episodes: int, seed: int,
               max_steps: int, source: str | None = None) -> dict[str, float]:
    """Closed-loop success rate per task of ``runner`` on the arm (seeded resets).

    ``source`` labels the commands (e.g. ``policy:<model sha256 prefix>``).
    """
    from fed_ros.sim.collect import STREAM_EVALUATE, episode_seed

    arm.wait_for_arm(60.0)
    rates = {}
    for task in tasks:
        wins = 0
        for i in range(episodes):
            _, episode = arm.reset(task, variation, episode_seed(seed, i, STREAM_EVALUATE))
            outcome = arm.run_episode(runner, episode, timeout=300.0, max_steps=max_steps, source=source)
            wins += int(outcome.success)
        rates[task] = wins / episodes
    return rates
