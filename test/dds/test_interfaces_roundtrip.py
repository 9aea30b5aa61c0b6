"""Every fed_ros message type and the Register/Record services between two processes over
Fast DDS (loopback, random domain), tensor payloads of 21.5 MB, bytes checked by sha256.

The peer is this file run as a script (``--peer``): it echoes each message type back,
assembles tensor payloads itself and reports their verified sha256, fetches a payload
over the zmq bulk channel named by a ROS control message, serves Register and Record,
and publishes a chunked ClusterModel with TRANSIENT_LOCAL before the test subscribes
(the late-joiner path of the cluster model).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

PAYLOAD_MB = 21.5
CHUNK = 4 << 20
ECHO = (
    "model_update",
    "cluster_model",
    "client_descriptor",
    "round_announcement",
    "round_report",
    "arm_command",
    "episode_status",
)


def _types() -> dict:
    from fed_ros.msg import (
        ArmCommand,
        ClientDescriptor,
        ClusterModel,
        EpisodeStatus,
        ModelUpdate,
        RoundAnnouncement,
        RoundReport,
    )

    return {
        "model_update": ModelUpdate,
        "cluster_model": ClusterModel,
        "client_descriptor": ClientDescriptor,
        "round_announcement": RoundAnnouncement,
        "round_report": RoundReport,
        "arm_command": ArmCommand,
        "episode_status": EpisodeStatus,
    }


def _state_dict(seed: int, megabytes: float = PAYLOAD_MB) -> dict[str, np.ndarray]:
    n = int(megabytes * 1e6) // 4
    rng = np.random.default_rng(seed)
    return {
        "encoder.weight": rng.standard_normal(n // 2, dtype=np.float32).reshape(-1, 50),
        "head.weight": rng.standard_normal(n - n // 2, dtype=np.float32),
    }


# ----------------------------------------------------------------------------- peer


def _peer() -> None:
    import rclpy
    from rclpy.executors import ExternalShutdownException
    from std_msgs.msg import String

    from fed_ros.msg import ClusterModel, ModelUpdate
    from fed_ros.ros.wire.round_msgs import cluster_model_msg
    from fed_ros.ros.wire.tensors import encode_state_dict, sha256_hex
    from fed_ros.ros.wire.qos import control_qos, model_state_qos
    from fed_ros.ros.wire.bulk_fetch import fetch_bulk
    from fed_ros.ros.wire.chunk_assembler import PayloadAssembler, PayloadRejected, TransferLimits
    from fed_ros.ros.wire.chunk_sender import ChunkedSender
    from fed_ros.srv import Record, Register

    rclpy.init()
    node = rclpy.create_node("roundtrip_peer")
    report = node.create_publisher(String, "rt/report", control_qos())
    assembler = PayloadAssembler(TransferLimits(max_total_bytes=64 << 20))

    def say(**kw) -> None:
        report.publish(String(data=json.dumps(kw)))

    echo_pubs: list = []

    def make_echo(name: str, msg_type):
        pub = node.create_publisher(msg_type, f"rt/{name}/out", control_qos())
        echo_pubs.append(pub)

        def on_msg(msg) -> None:
            if hasattr(msg, "payload") and hasattr(msg.payload, "sha256"):
                try:
                    done = assembler.add(msg.payload)
                    if done is not None:
                        say(
                            kind="assembled",
                            topic=name,
                            payload_id=done.payload_id,
                            sha256=done.sha256,
                        )
                except PayloadRejected as exc:
                    say(kind="rejected", topic=name, reason=str(exc))
            pub.publish(msg)  # echo as received

        node.create_subscription(msg_type, f"rt/{name}/in", on_msg, control_qos())

    for name, msg_type in _types().items():
        make_echo(name, msg_type)

    def on_bulk(msg: ModelUpdate) -> None:
        try:
            data = fetch_bulk(msg.payload, limits=assembler.limits)
            say(
                kind="bulk",
                payload_id=msg.payload.payload_id,
                sha256=sha256_hex(data),
                robot_id=msg.robot_id,
            )
        except (PayloadRejected, TimeoutError) as exc:
            say(kind="rejected", topic="bulk", reason=str(exc))

    node.create_subscription(ModelUpdate, "rt/bulk_update", on_bulk, control_qos())

    def on_register(req, resp):
        resp.accepted = req.robot_id.startswith("robot_")
        resp.reason = (
            f"hello {req.robot_id} ({len(req.public_key)}-byte key, {','.join(req.tasks)})"
        )
        resp.current_round = req.action_dim
        resp.cluster_ids = [0, 1]
        resp.weights = [0.25, 0.75]
        return resp

    def on_record(req, resp):
        resp.ok = req.command in (req.START, req.STOP, req.DISCARD)
        resp.message = f"{req.command}:{req.task}:{req.variation}:{req.success}"
        resp.episode_path = f"/episodes/{req.task}"
        resp.num_steps = len(req.instruction)
        return resp

    node.create_service(Register, "rt/register", on_register)
    node.create_service(Record, "rt/record", on_record)

    # Latched, chunked cluster model published before anyone subscribes.
    enc = encode_state_dict(_state_dict(seed=7))
    sender = ChunkedSender(enc, "fleet/r3/cluster_1", chunk_bytes=CHUNK)
    latched = node.create_publisher(
        ClusterModel, "rt/cluster_model_latched", model_state_qos(sender.chunk_count)
    )
    for chunk in sender.chunks():
        latched.publish(
            cluster_model_msg(chunk, cluster_id=1, round_idx=3, member_robot_ids=["robot_0"])
        )

    # Discovery is per direction: say once our writers (echoes, reports) matched the test's
    # readers, so the test waits on that instead of a settle delay.
    def announce_matched() -> None:
        if report.get_subscription_count() > 0 and all(
            p.get_subscription_count() > 0 for p in echo_pubs
        ):
            say(kind="matched")
            matched_timer.cancel()

    matched_timer = node.create_timer(0.05, announce_matched)
    print("peer ready", flush=True)
    try:
        rclpy.spin(node)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        node.destroy_node()
        rclpy.try_shutdown()


if __name__ == "__main__" and "--peer" in sys.argv:
    _peer()
    sys.exit(0)


# ----------------------------------------------------------------------------- test

import pytest  # noqa: E402

pytestmark = pytest.mark.ros


class _Harness:
    """The test side: its own rclpy Context, publishers to the peer, collected replies."""

    def __init__(self) -> None:
        import rclpy
        from rclpy.executors import SingleThreadedExecutor
        from std_msgs.msg import String

        from fed_ros.msg import ClusterModel, ModelUpdate
        from fed_ros.ros.wire.qos import control_qos, model_state_qos
        from fed_ros.srv import Record, Register

        self.rclpy = rclpy
        self.ctx = rclpy.Context()
        rclpy.init(context=self.ctx)
        self.node = rclpy.create_node("roundtrip_test", context=self.ctx)
        self.executor = SingleThreadedExecutor(context=self.ctx)
        self.executor.add_node(self.node)
        self.pubs, self.received, self.subs = {}, {name: [] for name in ECHO}, {}
        for name, msg_type in _types().items():
            self.pubs[name] = self.node.create_publisher(msg_type, f"rt/{name}/in", control_qos())
            self.subs[name] = self.node.create_subscription(
                msg_type,
                f"rt/{name}/out",
                lambda m, n=name: self.received[n].append(m),
                control_qos(),
            )
        self.bulk_pub = self.node.create_publisher(ModelUpdate, "rt/bulk_update", control_qos())
        self.reports: list[dict] = []
        self.report_sub = self.node.create_subscription(
            String, "rt/report", lambda m: self.reports.append(json.loads(m.data)), control_qos()
        )
        self.register = self.node.create_client(Register, "rt/register")
        self.record = self.node.create_client(Record, "rt/record")
        self.latched: list = []
        self._latched_args = (ClusterModel, "rt/cluster_model_latched", model_state_qos)

    def spin_until(self, cond, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
            self.executor.spin_once(timeout_sec=0.02)

    def subscribe_latched(self, depth: int) -> None:
        msg_type, topic, qos = self._latched_args
        self.node.create_subscription(msg_type, topic, self.latched.append, qos(depth))

    def call(self, client, request, timeout: float = 30.0):
        """Asked again while unanswered (fed_ros.ros.wire.service_calls); both echo services are
        pure."""
        from fed_ros.ros.wire.service_calls import call_client_until_answered, spinning

        return call_client_until_answered(
            client,
            request,
            spinning(lambda s: self.executor.spin_once(timeout_sec=s)),
            attempt_s=10.0,
            timeout_s=timeout,
        )

    def close(self) -> None:
        self.executor.shutdown()
        self.node.destroy_node()
        self.rclpy.try_shutdown(context=self.ctx)


def _echo_tensor_payload(
    h: _Harness, name: str, wrap, enc, payload_id: str, chunk_bytes: int
) -> float:
    """Send a payload to the peer, assemble the echo; returns the round-trip seconds."""
    from fed_ros.ros.wire.chunk_assembler import PayloadAssembler, TransferLimits
    from fed_ros.ros.wire.chunk_sender import ChunkedSender

    sender = ChunkedSender(enc, payload_id, chunk_bytes=chunk_bytes)
    assembler = PayloadAssembler(TransferLimits(max_total_bytes=64 << 20))
    start = len(h.received[name])
    done: list = []
    t0 = time.perf_counter()
    for chunk in sender.chunks():
        h.pubs[name].publish(wrap(chunk))

    def collect() -> bool:
        while len(h.received[name]) > start and not done:
            msg = h.received[name].pop(start)
            result = assembler.add(msg.payload)
            if result is not None:
                done.append((msg, result))
        return bool(done)

    h.spin_until(collect, 30, f"echo of {payload_id}")
    rtt = time.perf_counter() - t0
    msg, result = done[0]
    assert result.sha256 == enc.sha256 and result.data.tobytes() == enc.data.tobytes()
    h.spin_until(
        lambda: any(r.get("payload_id") == payload_id for r in h.reports),
        10,
        f"peer report {payload_id}",
    )
    peer = [r for r in h.reports if r.get("payload_id") == payload_id][0]
    assert peer["kind"] == "assembled" and peer["sha256"] == enc.sha256, peer
    return rtt


def test_every_message_and_service_between_processes(
    ros_env, processes, tmp_path: Path, capsys
) -> None:
    from builtin_interfaces.msg import Time
    from rclpy.serialization import serialize_message

    from fed_ros.core.strategies.types import ClientDescriptor as CoreDescriptor
    from fed_ros.msg import ArmCommand, ClusterMetrics, EpisodeStatus, RobotMetrics, RoundReport
    from fed_ros.core.rounds.config import RoundConfig
    from fed_ros.ros.wire.round_msgs import (
        Announcement,
        announcement_from_msg,
        announcement_to_msg,
        cluster_model_msg,
        descriptor_from_msg,
        descriptor_to_msg,
        model_update_msg,
    )
    from fed_ros.ros.wire.tensors import chunk_ranges, encode_state_dict
    from fed_ros.ros.wire.bulk import BulkServer
    from fed_ros.ros.wire.chunk_assembler import PayloadAssembler, TransferLimits
    from fed_ros.ros.wire.chunk_sender import ChunkedSender
    from fed_ros.srv import Record, Register

    peer = processes.python(
        [str(Path(__file__).resolve()), "--peer"], ros_env, log_path=tmp_path / "peer.log"
    )
    h = _Harness()
    try:

        def ready() -> bool:
            return (
                all(p.get_subscription_count() > 0 for p in h.pubs.values())
                # matched by our readers, not only listed in the graph
                and all(h.subs[n].get_publisher_count() > 0 for n in ECHO)
                and h.bulk_pub.get_subscription_count() > 0
                and h.report_sub.get_publisher_count() > 0
                and h.register.service_is_ready()
                and h.record.service_is_ready()
                and peer.poll() is None
                # and the reverse direction: the peer's writers matched our readers
                and any(r.get("kind") == "matched" for r in h.reports)
            )

        try:
            h.spin_until(ready, 30, "the peer's endpoints")
        except AssertionError:
            raise AssertionError((tmp_path / "peer.log").read_text()[-3000:])

        # -- ModelUpdate: chunked and unchunked, 21.5 MB, echoed and checked by sha256
        enc = encode_state_dict(_state_dict(seed=1))
        assert abs(enc.total_bytes - PAYLOAD_MB * 1e6) < 8

        def as_update(chunk):
            return model_update_msg(
                chunk,
                robot_id="robot_1",
                round_idx=3,
                base_round=2,
                cluster_id=1,
                num_samples=4096,
                train_loss=0.25,
                nonce=b"\x07" * 16,
                signature=b"s" * 64,
            )

        rtt_cold = _echo_tensor_payload(
            h, "model_update", as_update, enc, "robot_1/r3/chunked", CHUNK
        )
        rtt_chunked = _echo_tensor_payload(
            h, "model_update", as_update, enc, "robot_1/r3/chunked-warm", CHUNK
        )
        rtt_whole = _echo_tensor_payload(
            h, "model_update", as_update, enc, "robot_1/r3/whole", 1 << 30
        )
        probe = as_update(
            ChunkedSender(encode_state_dict(_state_dict(2, 0.01)), "meta", CHUNK).chunk(0)
        )
        h.pubs["model_update"].publish(probe)
        h.spin_until(lambda: len(h.received["model_update"]) > 0, 10, "ModelUpdate metadata echo")
        back = h.received["model_update"].pop()
        assert (back.robot_id, back.round, back.base_round, back.cluster_id, back.num_samples) == (
            "robot_1",
            3,
            2,
            1,
            4096,
        )
        assert bytes(back.nonce) == b"\x07" * 16 and bytes(back.signature) == b"s" * 64
        assert back.payload.chunk_count == 1 and back.payload.sha256 == probe.payload.sha256

        # -- ClusterModel: chunked and unchunked (int8 encoding carries scales)
        enc8 = encode_state_dict(_state_dict(seed=3), "int8")

        def as_cluster(chunk):
            return cluster_model_msg(
                chunk, cluster_id=2, round_idx=4, member_robot_ids=["robot_0", "robot_1"]
            )

        _echo_tensor_payload(h, "cluster_model", as_cluster, enc, "fleet/r4/cluster_2", CHUNK)
        _echo_tensor_payload(
            h, "cluster_model", as_cluster, enc8, "fleet/r4/cluster_2/int8", 1 << 30
        )

        # -- late joiner: the peer's TRANSIENT_LOCAL chunked cluster model arrives whole
        latched_enc = encode_state_dict(_state_dict(seed=7))
        chunks = len(chunk_ranges(latched_enc.total_bytes, CHUNK))
        h.subscribe_latched(chunks)
        assembler = PayloadAssembler(TransferLimits(max_total_bytes=64 << 20))
        got: list = []

        def latched_done() -> bool:
            while h.latched and not got:
                result = assembler.add(h.latched.pop(0).payload)
                if result is not None:
                    got.append(result)
            return bool(got)

        h.spin_until(latched_done, 20, "the latched cluster model")
        assert got[0].sha256 == latched_enc.sha256

        # -- zmq bulk: control message over ROS, bytes pulled by the peer
        with BulkServer() as bulk:
            uri = bulk.offer(enc.data)
            control = ChunkedSender(enc, "robot_1/r3/bulk", bulk_uri=uri).chunk(0)
            t0 = time.perf_counter()
            h.bulk_pub.publish(
                model_update_msg(control, robot_id="robot_1", round_idx=3, base_round=2)
            )
            h.spin_until(
                lambda: any(r.get("payload_id") == "robot_1/r3/bulk" for r in h.reports),
                20,
                "the bulk fetch report",
            )
            t_bulk = time.perf_counter() - t0
        report = [r for r in h.reports if r.get("payload_id") == "robot_1/r3/bulk"][0]
        assert report["kind"] == "bulk" and report["sha256"] == enc.sha256, report

        # -- ClientDescriptor with an opaque payload (an RND predictor's bytes)
        desc = CoreDescriptor(
            robot_id="robot_2",
            kind="gaussian",
            mean=np.linspace(0, 1, 256, dtype=np.float32),
            variance=np.full(256, 0.5, np.float32),
            num_samples=900,
            scores={"robot_1": 0.5},
            payload=bytes(np.random.default_rng(5).integers(0, 255, 1 << 20, dtype=np.uint8)),
        )
        h.pubs["client_descriptor"].publish(descriptor_to_msg(desc, round_idx=3, nonce=b"n" * 16))
        h.spin_until(lambda: len(h.received["client_descriptor"]) > 0, 10, "descriptor echo")
        back_desc = descriptor_from_msg(h.received["client_descriptor"][0])
        assert back_desc.payload == desc.payload and back_desc.scores == desc.scores
        np.testing.assert_array_equal(back_desc.mean, desc.mean)

        # -- small messages: echoed equal field by field
        ann = announcement_to_msg(
            Announcement(
                round_idx=3,
                stage="train",
                deadline_s=1700000000.25,
                algorithm="feddrman",
                participants=("robot_0", "robot_1"),
                memberships={"robot_0": [(0, 1.0)], "robot_1": [(0, 0.5), (1, 0.5)]},
                quorum=2,
                configs={"robot_0": RoundConfig(prox_mu=0.01, lr=1e-3)},
            )
        )
        report_msg = RoundReport(
            round=3,
            algorithm="feddrman",
            completed=True,
            status="ok",
            updates_received=2,
            updates_accepted=2,
            aggregation_seconds=0.5,
            robots=[
                RobotMetrics(
                    robot_id="robot_0",
                    cluster_ids=[0],
                    num_samples=10,
                    success_rate=0.75,
                    accepted=True,
                )
            ],
            clusters=[ClusterMetrics(cluster_id=0, member_robot_ids=["robot_0"], update_norm=1.5)],
            diagnostic_names=["objective"],
            diagnostic_values=[0.125],
        )
        arm = ArmCommand(
            action=[0.1, -0.2, 0.3], gripper=1.0, mode=ArmCommand.MODE_OSC_POSITION, source="expert"
        )
        arm.header.stamp = Time(sec=5, nanosec=7)
        arm.header.frame_id = "robot_0/base"
        status = EpisodeStatus(
            task="lift",
            instruction="lift the cube",
            variation="default",
            episode=4,
            step=17,
            success=True,
            done=True,
            overruns=1,
        )
        for name, msg in (
            ("round_announcement", ann),
            ("round_report", report_msg),
            ("arm_command", arm),
            ("episode_status", status),
        ):
            h.pubs[name].publish(msg)
            h.spin_until(lambda n=name: len(h.received[n]) > 0, 10, f"{name} echo")
            # float32 fields round to float32 on the wire: compare the serialized forms
            assert serialize_message(h.received[name][0]) == serialize_message(msg), name
        assert announcement_from_msg(h.received["round_announcement"][0]).memberships[
            "robot_1"
        ] == [(0, 0.5), (1, 0.5)]

        # -- services
        reg = h.call(
            h.register,
            Register.Request(
                robot_id="robot_3",
                public_key=b"k" * 32,
                tasks=["lift", "stack"],
                cameras=["agentview"],
                action_dim=4,
                has_gpu=False,
                num_samples=7,
            ),
        )
        assert reg.accepted and reg.reason == "hello robot_3 (32-byte key, lift,stack)"
        assert reg.current_round == 4 and list(reg.cluster_ids) == [0, 1]
        np.testing.assert_allclose(reg.weights, [0.25, 0.75])
        rec = h.call(
            h.record,
            Record.Request(
                command=Record.Request.STOP,
                task="lift",
                instruction="lift it",
                variation="default",
                success=True,
            ),
        )
        assert (
            rec.ok and rec.message == "1:lift:default:True" and rec.episode_path == "/episodes/lift"
        )
        assert rec.num_steps == len("lift it")

        assert not [r for r in h.reports if r["kind"] == "rejected"], h.reports
        with capsys.disabled():
            mb = enc.total_bytes / 1e6
            print(
                f"\n[roundtrip] {mb:.1f} MB ModelUpdate echo over Fast DDS (default transports): "
                f"chunked {CHUNK >> 20} MiB {rtt_chunked * 1e3:.0f} ms round trip (first, cold: "
                f"{rtt_cold * 1e3:.0f} ms), unchunked {rtt_whole * 1e3:.0f} ms; "
                f"zmq bulk one way incl. ROS control message + sha256: {t_bulk * 1e3:.0f} ms"
            )
    finally:
        h.close()
