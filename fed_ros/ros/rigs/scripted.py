"""A signed fleet over real DDS with scripted honest robots, shared by the hostile-peer suite
(test/slow/test_hostile_peers.py) and `fed-ros bench robustness --protocol`:
keys + allow-list, the real server process's argv, scripted honest robots (signed registration,
deterministic signed chunked updates) and a process's resident memory. The reference result of
the same federation without any attacker, and what the server committed, are in
:mod:`fed_ros.ros.rigs.reference_federation`.

    keys = make_keys(tmp_path, ROBOTS)
    server = <start> server_argv(tmp_path, ROBOTS, rounds=3)
    robots = ScriptedRobots(keys, ROBOTS); robots.register_all(); ...
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from fed_ros.core.security import auth, signed_messages
from fed_ros.core.security.key_admin import generate_keys
from fed_ros.core.checks.update_checks import UpdateEnvelope

ROBOTS = ("robot_0", "robot_1")


def make_keys(tmp_path: Path, robots=ROBOTS) -> dict[str, auth.Signer]:
    """Robot and server key pairs plus ``keys/allow_list.yaml`` (with the server key)."""
    assert generate_keys(tmp_path / "keys", robots, server=True) == 0
    return {
        rid: auth.Signer.from_file(tmp_path / "keys" / f"{rid}.key") for rid in (*robots, "server")
    }


def server_argv(
    tmp_path: Path,
    robots=ROBOTS,
    rounds: int = 3,
    algorithm: str = "fedavg",
    signed: bool = True,
    extra: tuple[str, ...] = (),
) -> list[str]:
    """The real server node, signatures required, allow-list with the server key, ROS chunks."""
    argv = [
        sys.executable,
        "-m",
        "fed_ros.ros.nodes.server.server_node",
        "--ros-args",
        "-r",
        "__ns:=/fleet",
        "-p",
        f"algorithm:={algorithm}",
        "-p",
        f"rounds:={rounds}",
        "-p",
        f"state_dir:={tmp_path / 'state'}",
        "-p",
        f"expected_robots:=[{','.join(robots)}]",
        "-p",
        "transfer_channel:=ros",
        "-p",
        "round_timeout_s:=120.0",
        "-p",
        "seed:=0",
    ]
    if signed:
        argv += [
            "-p",
            "require_signatures:=true",
            "-p",
            f"allowed_keys_file:={tmp_path / 'keys' / 'allow_list.yaml'}",
            "-p",
            f"private_key_file:={tmp_path / 'keys' / 'server.key'}",
        ]
    for item in extra:
        argv += ["-p", item]
    return argv


def initial_model() -> dict[str, np.ndarray]:
    """The fleet's initial model (lowdim policy, seed 0): what the server starts from."""
    from fed_ros.learning.configuration_policy import PolicyConfig
    from fed_ros.learning.trainer import initial_state_dict

    return initial_state_dict(PolicyConfig(kind="lowdim"), seed=0)


def honest_update(initial: dict, round_idx: int, k: int) -> dict[str, np.ndarray]:
    """Robot k's deterministic 'training' result for a round (seeded)."""
    rng = np.random.default_rng([11, round_idx, k])
    return {n: (a + rng.normal(0, 0.01, a.shape)).astype(np.float32) for n, a in initial.items()}


def rss_mb(pid: int) -> float:
    """Resident set size of a process in MiB (/proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    raise RuntimeError(f"no VmRSS for pid {pid}")


def wait_for(predicate, timeout: float, what: str, poll=None, alive=None) -> None:
    """Wait on a condition with a deadline (``poll()`` is called while waiting; ``alive()`` must
    stay true)."""
    end = time.monotonic() + timeout
    while not predicate():
        if alive is not None:
            assert alive(), f"{what}: a process died while waiting"
        assert time.monotonic() < end, f"timed out after {timeout:.0f} s waiting for {what}"
        if poll is not None:
            poll()
        else:
            time.sleep(0.05)


class ScriptedRobots:
    """Honest robots as one rclpy node in the test process: signed registration, then a
    deterministic, signed, chunked ModelUpdate for every TRAIN announcement."""

    def __init__(
        self,
        signers: dict,
        robots=ROBOTS,
        initial: dict | None = None,
        chunk_bytes: int = 64 << 10,
        hold: bool = False,
    ) -> None:
        import rclpy
        from rclpy.context import Context
        from rclpy.executors import SingleThreadedExecutor
        from fed_ros.msg import ClusterModel, ModelUpdate, RoundAnnouncement, RoundReport, UpdateAck
        from fed_ros.ros.wire import qos
        from fed_ros.srv import Register

        self.ctx = Context()
        rclpy.init(context=self.ctx)
        self.node = rclpy.create_node("honest_robots", context=self.ctx)
        self.executor = SingleThreadedExecutor(context=self.ctx)
        self.executor.add_node(self.node)
        self.signers, self.robots = signers, tuple(robots)
        self.initial = initial if initial is not None else initial_model()
        self.chunk_bytes = chunk_bytes
        self.stage = ""
        self.reports: dict[int, object] = {}
        self.model_signatures: list[
            tuple[int, int, str, bytes]
        ] = []  # (cluster, round, sha256, signature)
        self.answered: set[tuple] = set()
        self.hold = hold  # True: TRAIN announcements wait (e.g. until an attack is done)
        self.answer_through: int | None = None  # rounds above it wait too (None: no limit)
        self.round = -1  # round of the last announcement
        self.sent: list[str] = []  # payload ids of the updates sent
        self.between_chunks = None  # callable(payload_id, chunks) run after chunk 0 of each update
        self.pending: tuple | None = None
        self.pub = self.node.create_publisher(ModelUpdate, "/fleet/updates", qos.control_qos())
        self.node.create_subscription(
            RoundAnnouncement, "/fleet/round", self._on_round, qos.latched_qos()
        )
        self.node.create_subscription(
            RoundReport,
            "/fleet/round_report",
            lambda m: self.reports.__setitem__(int(m.round), m),
            qos.latched_qos(),
        )
        self.node.create_subscription(
            ClusterModel, "/fleet/cluster_models", self._on_model, qos.model_state_qos(64)
        )
        self.client = self.node.create_client(Register, "/fleet/register")
        self.last_request = None  # the Register request sent last (see call)
        # Chunks the server's KEEP_LAST inbox dropped are asked for again (signed by the server).
        from std_msgs.msg import String

        self.uploads: dict[str, tuple] = {}  # payload id -> (ChunkedSender, message fields)
        self.node.create_subscription(
            String, "/fleet/update_resend", self._on_resend, qos.control_qos()
        )
        # Like a real robot (nodes.robot.uplink.UpdateUplink): an update the server did not
        # acknowledge is sent again (its first chunk may have been pushed out of the server's
        # KEEP_LAST inbox).
        self.acked: set[str] = set()
        self.retry_s = 5.0
        self.last_sent: dict[str, float] = {}
        self.node.create_subscription(
            UpdateAck,
            "/fleet/update_acks",
            lambda m: self.acked.add(str(m.payload_id)),
            qos.control_qos(),
        )

    def spin(self, seconds: float = 0.1) -> None:
        from fed_ros.ros.wire.round_msgs import model_update_msg

        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.executor.spin_once(timeout_sec=0.02)
            if (
                self.pending is not None
                and not self.hold
                and (self.answer_through is None or self.pending[0] <= self.answer_through)
            ):
                pending, self.pending = self.pending, None
                self._answer(*pending)
            now = time.monotonic()
            for pid, (sender, fields) in list(self.uploads.items()):
                if (
                    pid not in self.acked
                    and fields["round_idx"] == self.round
                    and self.stage == "train"
                    and now - self.last_sent.get(pid, now) >= self.retry_s
                ):
                    self.last_sent[pid] = now
                    for chunk in sender.chunks():
                        self.pub.publish(model_update_msg(chunk, **fields))

    def call(self, request, timeout: float = 60.0):
        """A Register call, asked again while unanswered (fed_ros.ros.wire.service_calls); the
        response.

        ``request``: a Register.Request, or a function building one per try (a signed request
        needs a fresh nonce: the server refuses the same one twice as a replay).
        """
        from fed_ros.ros.wire.service_calls import call_client_until_answered, spinning

        make = request if callable(request) else (lambda: request)

        def remembered():
            self.last_request = make()
            return self.last_request

        return call_client_until_answered(
            self.client,
            remembered,
            spinning(lambda s: self.executor.spin_once(timeout_sec=s)),
            attempt_s=10.0,
            timeout_s=timeout,
        )

    def register_all(self, timeout: float = 60.0) -> None:
        from fed_ros.ros.wire.register import register_request

        assert self.client.wait_for_service(timeout_sec=timeout), (
            "server did not offer /fleet/register"
        )
        for k, rid in enumerate(self.robots):
            res = self.call(
                lambda rid=rid, k=k: register_request(
                    rid, tasks=["lift"], num_samples=100 + 10 * k, signer=self.signers[rid]
                )
            )
            assert res.accepted, (rid, res.reason)

    def publish_probe(self) -> None:
        """One ModelUpdate with payload id "probe" (a listener's handshake: it hears our writer)."""
        from fed_ros.msg import ModelUpdate

        probe = ModelUpdate(robot_id="probe")
        probe.payload.payload_id = "probe"
        self.pub.publish(probe)

    def _on_model(self, msg) -> None:
        if int(msg.payload.chunk_index) == 0:
            self.model_signatures.append(
                (int(msg.cluster_id), int(msg.round), msg.payload.sha256, bytes(msg.signature))
            )

    def _on_round(self, msg) -> None:
        from fed_ros.ros.wire.round_msgs import STAGE_NAMES

        self.stage = STAGE_NAMES.get(int(msg.stage))
        self.round = int(msg.round)
        if self.stage == "train":
            self.pending = (
                int(msg.round),
                list(msg.participants),
                (msg.header.stamp.sec, msg.header.stamp.nanosec),
            )

    def _answer(self, round_idx: int, participants: list, stamp: tuple) -> None:
        from fed_ros.ros.wire.publish import wait_for_subscribers
        from fed_ros.ros.wire.round_msgs import model_update_msg
        from fed_ros.ros.wire.tensors import encode_state_dict
        from fed_ros.ros.wire.chunk_sender import ChunkedSender

        wait_for_subscribers(self.node, self.pub, "/fleet/updates", timeout=30.0)
        for k, rid in enumerate(self.robots):
            if rid not in participants or (rid, round_idx, stamp) in self.answered:
                continue
            self.answered.add((rid, round_idx, stamp))
            encoded = encode_state_dict(honest_update(self.initial, round_idx, k))
            nonce = signed_messages.new_nonce()
            sender = ChunkedSender(
                encoded, f"{rid}/r{round_idx}/{nonce.hex()[:8]}", chunk_bytes=self.chunk_bytes
            )
            env = UpdateEnvelope(
                robot_id=rid,
                round_idx=round_idx,
                base_round=round_idx,
                num_samples=100 + 10 * k,
                manifest=encoded.manifest,
                total_bytes=encoded.total_bytes,
                payload_sha256=encoded.sha256,
                nonce=nonce,
                transfer=sender.transfer_digest(),
            ).signed(self.signers[rid])
            self.sent.append(sender.payload_id)
            self.uploads[sender.payload_id] = (
                sender,
                dict(
                    robot_id=rid,
                    round_idx=round_idx,
                    base_round=round_idx,
                    num_samples=env.num_samples,
                    nonce=env.nonce,
                    signature=env.signature,
                ),
            )
            chunks = list(sender.chunks())
            self.pub.publish(
                model_update_msg(
                    chunks[0],
                    robot_id=rid,
                    round_idx=round_idx,
                    base_round=round_idx,
                    num_samples=env.num_samples,
                    nonce=env.nonce,
                    signature=env.signature,
                )
            )
            if (
                self.between_chunks is not None
            ):  # e.g. an attacker who saw chunk 0 injects a foreign chunk 1
                self.between_chunks(sender.payload_id, chunks)
            for chunk in chunks[1:]:
                self.pub.publish(
                    model_update_msg(
                        chunk,
                        robot_id=rid,
                        round_idx=round_idx,
                        base_round=round_idx,
                        num_samples=env.num_samples,
                        nonce=env.nonce,
                        signature=env.signature,
                    )
                )
            self.last_sent[sender.payload_id] = time.monotonic()

    def _on_resend(self, msg) -> None:
        from fed_ros.ros.wire.round_msgs import model_update_msg
        from fed_ros.ros.wire.signed import verify_json
        from fed_ros.ros.wire.chunk_assembler import decode_resend_request

        server = self.signers.get("server")
        if (
            server is not None
            and verify_json(msg.data, "update_resend", lambda obj: server.public_key) is not None
        ):
            return  # not from our server
        pid, indices = decode_resend_request(msg.data)
        if pid in self.uploads:
            sender, fields = self.uploads[pid]
            for chunk in sender.resend(indices):
                self.pub.publish(model_update_msg(chunk, **fields))

    def close(self) -> None:
        self.node.destroy_node()
        self.ctx.try_shutdown()
