"""Scripted expert driving an arm over ROS to produce demonstrations.

The expert sees only what arrives on the arm's topics (the path a teleoperated real arm
takes) and publishes ``arm/command``. Each episode: reset the arm (``arm/reset``), Record
START, drive until the arm reports done, Record STOP with the outcome. Recording goes
through a robot node's ``fed_ros/srv/Record`` service (``record_service``) or, with
``record_dir`` set, through a :class:`~fed_ros.ros.arm.recorder.Recorder` owned by this node
(standalone: no robot node needed).
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass

import rclpy
from rclpy.executors import ExternalShutdownException, MultiThreadedExecutor
from rclpy.node import Node

from fed_ros.ros import shutdown
from fed_ros.ros.arm.arm_client import ArmClient
from fed_ros.ros.configuration.arm_params import ExpertDriverParams
from fed_ros.ros.nodes.typed_params import declare_typed_parameters
from fed_ros.ros.shutdown import ShutdownRequested


@dataclass
class DemoResult:
    """One driven episode."""

    index: int
    seed: int
    success: bool
    steps: int
    path: str
    message: str = ""


class ExpertDriverNode(Node):
    """Runs ``episodes`` expert episodes on one arm and records each of them."""

    def __init__(self, **kwargs) -> None:
        super().__init__("expert_driver", **kwargs)
        # Typed, described parameters (ExpertDriverParams); a live `ros2 param set` is applied or
        # refused.
        self.params = p = declare_typed_parameters(
            self, ExpertDriverParams, self._on_params_changed
        )
        self.task, self.variation, self.episodes, self.seed = (
            p.task,
            p.variation,
            p.episodes,
            p.seed,
        )
        self.noise_std, self.cameras, self.robot_id = p.noise_std, p.cameras, p.robot_id
        self.record_service, self.record_dir = p.record_service, p.record_dir
        self.episode_timeout, self.connect_timeout = p.episode_timeout_s, p.connect_timeout_s

        self.arm = ArmClient(self, cameras=self.cameras, source="expert")
        self.recorder = None
        self._record_client = None
        if self.record_dir:
            from fed_ros.ros.arm.recorder import Recorder

            self.recorder = Recorder(
                self, self.record_dir, robot_id=self.robot_id, cameras=self.cameras
            )
        elif self.record_service:
            from fed_ros.srv import Record

            self._Record = Record
            self._record_client = self.create_client(Record, self.record_service)
        self.results: list[DemoResult] = []

    def _on_params_changed(self, params: ExpertDriverParams) -> None:
        """A live `ros2 param set` (episode_timeout_s): run() gives the next episode the new
        timeout."""
        self.params, self.episode_timeout = params, params.episode_timeout_s
        self.get_logger().info(
            f"parameters applied: the next episode is given up after {self.episode_timeout:g} s"
        )

    # ------------------------------------------------------------------ recording
    def _call_record(self, command: int, success: bool = False, instruction: str = ""):
        request = self._Record.Request(
            command=command,
            task=self.task,
            instruction=instruction,
            variation=self.variation,
            success=success,
        )
        from fed_ros.ros.wire.service_calls import call_service

        response = call_service(self._record_client, request, 30.0)
        if response is None:
            raise TimeoutError(f"Record service {self.record_service!r} did not answer in 30 s")
        if not response.ok:
            raise RuntimeError(
                f"Record {['START', 'STOP', 'DISCARD'][command]} refused: {response.message}"
            )
        return response

    def _start_recording(self, instruction: str) -> None:
        if self.recorder is not None:
            self.recorder.start(self.task, instruction, self.variation)
        elif self._record_client is not None:
            self._call_record(self._Record.Request.START, instruction=instruction)

    def _stop_recording(self, success: bool) -> tuple[str, int]:
        if self.recorder is not None:
            result = self.recorder.stop(success)
            return str(result.path), result.num_steps
        if self._record_client is not None:
            response = self._call_record(self._Record.Request.STOP, success=success)
            return response.episode_path, int(response.num_steps)
        return "", 0

    # ------------------------------------------------------------------ episodes
    def run(self) -> list[DemoResult]:
        """Drive all episodes (call from a thread other than the executor's)."""
        from fed_ros.sim.collect import STREAM_COLLECT, episode_seed
        from fed_ros.sim.experts import make_expert

        if self._record_client is not None and not shutdown.wait_for_service(
            self._record_client, self.connect_timeout
        ):
            raise TimeoutError(f"no Record service {self.record_service!r}")
        self.arm.wait_for_arm(self.connect_timeout)
        expert = make_expert(
            self.task, noise_std=self.noise_std, seed=self.seed, variation=self.variation
        )
        for i in range(self.episodes):
            seed = episode_seed(self.seed, i, STREAM_COLLECT)
            instruction, episode = self.arm.reset(self.task, self.variation, seed)
            self._start_recording(instruction)
            outcome = self.arm.run_episode(expert, episode, timeout=self.episode_timeout)
            message = "timed out" if outcome.timed_out else ""
            try:
                path, _ = self._stop_recording(outcome.success)
            except (ValueError, RuntimeError) as exc:
                # A recording that cannot become an episode is reported, never trained on.
                path, message = "", str(exc)
                self.get_logger().error(f"episode {i}: recording unusable: {exc}")
            result = DemoResult(
                i, seed, outcome.success and not message, outcome.steps, path, message
            )
            self.results.append(result)
            self.get_logger().info(
                f"episode {i + 1}/{self.episodes} seed {seed}: "
                f"{'success' if outcome.success else 'failure'} in {outcome.steps} steps "
                f"(overruns {outcome.overruns}){' -> ' + path if path else ''}"
            )
        good = sum(r.success for r in self.results)
        self.get_logger().info(
            f"expert driver done: {good}/{self.episodes} successful demonstrations"
        )
        return self.results


@shutdown.node_main  # ends the process with os._exit after main()'s own teardown
def main(args: list[str] | None = None) -> int:
    """Run the expert driver: spin in a background thread, drive episodes, shut down.

    Exit code 0 when every episode succeeded or Ctrl-C / SIGTERM stopped it, 1 when some
    failed, 2 on a configuration, arm or service error.
    """
    shutdown.init(args)  # Ctrl-C sets a flag the arm client's waits observe (fed_ros.ros.shutdown)
    node = None
    executor = MultiThreadedExecutor(num_threads=3)
    spinner = None
    code = 1
    try:
        node = ExpertDriverNode()
        executor.add_node(node)
        spinner = threading.Thread(target=executor.spin, daemon=True)
        spinner.start()
        results = node.run()
        code = 0 if results and all(r.success for r in results) else 1
    except (KeyboardInterrupt, ExternalShutdownException, ShutdownRequested):
        code = 0
    except (ValueError, TimeoutError, RuntimeError) as exc:
        print(f"expert driver: {exc}", file=sys.stderr)
        code = 2
    finally:
        executor.shutdown(timeout_sec=2.0)
        if node is not None:
            if node.recorder is not None:
                node.recorder.destroy()
            node.destroy_node()
        rclpy.try_shutdown()
        if spinner is not None:
            spinner.join(timeout=2.0)
    return code


if __name__ == "__main__":
    sys.exit(main())
