"""Transfer recovery paths over real DDS: the real server node (a separate process) and two
robots as one rclpy node in the test process that use the robot node's transfer objects
(TransferSender, TransferReceiver, Outbox).

One federation round exercises, in order: `transfer_channel: auto` switching to the bulk channel
above a small threshold (cluster model out, an update in); a rejected update whose reason code
reaches the robot (and is counted once, also when re-sent); an update whose first publication is
lost, re-sent by the outbox until acknowledged and accepted once; an interrupted chunk stream
resumed through the server's resend request; a re-send of an accepted update acknowledged again
and never applied twice.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.ros

ROBOTS = ["robot_0", "robot_1"]
THRESHOLD = 4096  # bytes: every model of the test goes over the bulk channel under `auto`


class Robots:
    """Two robots in one node: register, receive acks/models/resend requests, publish updates."""

    def __init__(self, manifest) -> None:
        import rclpy
        from rclpy.context import Context
        from rclpy.executors import SingleThreadedExecutor
        from std_msgs.msg import String

        from fed_ros.core.rounds.delivery import Outbox, RetrySchedule
        from fed_ros.msg import ClusterModel, ModelUpdate, RoundAnnouncement, RoundReport, UpdateAck
        from fed_ros.ros.wire import qos
        from fed_ros.ros.wire.transfer import TransferSender
        from fed_ros.ros.wire.transfer_receiver import TransferReceiver
        from fed_ros.srv import Register

        self.ctx = Context()
        rclpy.init(context=self.ctx)
        self.node = rclpy.create_node("transfer_test_robots", context=self.ctx)
        self.executor = SingleThreadedExecutor(context=self.ctx)
        self.executor.add_node(self.node)
        self.Register = Register
        self.acks: list = []
        self.reports: dict[int, object] = {}
        self.models: list = []
        self.announcement = None
        self.resend_requests: list[str] = []
        self.ros_out = TransferSender("ros", chunk_bytes=64 << 10)
        self.auto_out = TransferSender("auto", bulk_threshold_bytes=THRESHOLD)
        self.models_in = TransferReceiver(manifest)
        self.outbox = Outbox(RetrySchedule(first_s=1.0, factor=2.0, max_s=2.0))
        self.resend_from = [
            self.ros_out
        ]  # senders whose chunks are re-sent on the server's request
        self.forges: dict = {}  # payload id -> the header forgery its chunks carry
        self.pub = self.node.create_publisher(ModelUpdate, "/fleet/updates", qos.control_qos())
        self.node.create_subscription(
            UpdateAck, "/fleet/update_acks", self._on_ack, qos.control_qos()
        )
        self.node.create_subscription(
            RoundAnnouncement,
            "/fleet/round",
            lambda m: setattr(self, "announcement", m),
            qos.latched_qos(),
        )
        self.report_log: list = []  # every report, in arrival order
        self.node.create_subscription(
            RoundReport,
            "/fleet/round_report",
            lambda m: (self.reports.__setitem__(int(m.round), m), self.report_log.append(m)),
            qos.model_state_qos(16),
        )
        self.node.create_subscription(
            ClusterModel, "/fleet/cluster_models", self.models.append, qos.model_state_qos(64)
        )
        self.node.create_subscription(
            String, "/fleet/update_resend", self._on_resend, qos.control_qos()
        )
        self.client = self.node.create_client(Register, "/fleet/register")

    def _on_ack(self, msg) -> None:
        """What the robot node does: an acknowledged update is not re-sent any more."""
        from fed_ros.core.checks.decisions import Decision

        self.acks.append(msg)
        self.outbox.acknowledge(msg.payload_id, Decision(msg.accepted, msg.code, msg.reason))

    def _on_resend(self, msg) -> None:
        """What the robot node does: answer with only the requested chunks (forged like the first
        time)."""
        from fed_ros.ros.wire.round_msgs import model_update_msg

        self.resend_requests.append(msg.data)
        for sender in self.resend_from:
            answer = sender.resend(msg.data)
            if answer is not None:
                out, chunks = answer
                for chunk in chunks:
                    update = model_update_msg(chunk, **out.meta)
                    if out.payload_id in self.forges:
                        self.forges[out.payload_id](update)
                    self.pub.publish(update)

    def spin_until(self, predicate, timeout: float, what: str, server=None) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            assert server is None or server.poll() is None, f"server died while waiting for {what}"
            self.spin_once()

    def spin_once(self, timeout: float = 0.05) -> None:
        self.executor.spin_once(timeout_sec=timeout)
        for entry in self.outbox.due():  # the robot node's _tick: re-send what is unacknowledged
            self.publish(entry.item)

    def register_all(self) -> None:
        from fed_ros.ros.wire.service_calls import call_client_until_answered, spinning

        assert self.client.wait_for_service(timeout_sec=60.0), (
            "server did not offer /fleet/register"
        )
        for rid in ROBOTS:
            # Asked again while unanswered (fed_ros.ros.wire.service_calls); registering twice is
            # harmless.
            request = self.Register.Request(
                robot_id=rid, action_dim=4, num_samples=100, tasks=["lift"]
            )
            answer = call_client_until_answered(
                self.client, request, spinning(self.spin_once), attempt_s=10.0, timeout_s=60.0
            )
            assert answer.accepted, answer.reason

    def prepare(self, sender, params: dict, rid: str, tag: str, round_idx: int = 0, **header):
        header = {"base_round": round_idx, "num_samples": 100, **header}
        return sender.prepare(
            params, f"{rid}/r{round_idx}/update/{tag}", robot_id=rid, round_idx=round_idx, **header
        )

    def publish(self, out, skip=(), forge=None) -> None:
        """Publish an update's chunks (``forge(msg)`` edits each message first: a forged header)."""
        from fed_ros.ros.wire.round_msgs import model_update_msg

        if forge is not None:
            self.forges[out.payload_id] = forge
        for chunk in out.chunks():
            if int(chunk.chunk_index) not in skip:
                msg = model_update_msg(chunk, **out.meta)
                if forge is not None:
                    forge(msg)
                self.pub.publish(msg)

    def acks_for(self, pid: str) -> list:
        return [a for a in self.acks if a.payload_id == pid]

    def close(self) -> None:
        self.models_in.close()
        self.ros_out.close()
        self.auto_out.close()
        self.node.destroy_node()
        self.ctx.try_shutdown()


@pytest.mark.timeout(300)
def test_transfer_recovery_paths_over_dds(tmp_path: Path, ros_env, processes) -> None:
    from fed_ros.core.checks.decisions import (
        DIGEST,
        DUPLICATE,
        FUTURE,
        NOT_PARTICIPANT,
        NUM_SAMPLES,
        OUT_OF_RANGE,
        OVERSIZE,
        SCHEMA,
        STALE_BASE,
        STALE_ROUND,
    )
    from fed_ros.core.params import manifest_of
    from fed_ros.ros.wire.transfer import TransferSender
    from fed_ros.core.checks.audit_log import read_audit_log
    from fed_ros.core.checks.decisions import NON_FINITE
    from fed_ros.learning.configuration_policy import PolicyConfig
    from fed_ros.learning.trainer import initial_state_dict

    initial = initial_state_dict(PolicyConfig(kind="lowdim"), seed=0)
    state_dir = tmp_path / "server"
    server = processes.start(
        [
            sys.executable,
            "-m",
            "fed_ros.ros.nodes.server.server_node",
            "--ros-args",
            "-r",
            "__ns:=/fleet",
            "-p",
            "algorithm:=fedavg",
            "-p",
            "rounds:=2",
            "-p",
            f"state_dir:={state_dir}",
            "-p",
            f"expected_robots:=[{','.join(ROBOTS)}]",
            "-p",
            "round_timeout_s:=200.0",
            "-p",
            "transfer_channel:=auto",
            "-p",
            f"bulk_threshold_bytes:={THRESHOLD}",
            "-p",
            "seed:=0",
        ],
        ros_env,
        log_path=tmp_path / "server.log",
    )
    robots = Robots(manifest_of(initial))
    log = lambda: (tmp_path / "server.log").read_text()[-4000:]  # noqa: E731
    try:
        robots.register_all()
        robots.spin_until(
            lambda: robots.announcement is not None and robots.announcement.round == 0,
            60.0,
            "round 0",
            server,
        )

        # `auto` above the threshold: the cluster model is one control message with a bulk_uri.
        robots.spin_until(lambda: robots.models, 30.0, "a cluster model", server)
        model = robots.models[0]
        assert model.payload.bulk_uri and len(model.payload.data) == 0, (
            "auto did not switch to bulk"
        )
        assert robots.models_in.offer(model.payload, tag=model) is None
        got = []
        robots.spin_until(
            lambda: got.extend(robots.models_in.completed()) or got, 30.0, "the model fetch"
        )
        assert got[0].decision, got[0].decision
        assert all(np.array_equal(got[0].params[k], initial[k]) for k in initial)

        # A rejected update: its reason code reaches the robot; a re-send is answered, not
        # re-counted.
        bad = {k: v.copy() for k, v in initial.items()}
        next(iter(bad.values())).reshape(-1)[0] = np.nan
        nan_out = robots.prepare(robots.ros_out, bad, "robot_0", "nan")
        robots.publish(nan_out)
        robots.spin_until(
            lambda: robots.acks_for(nan_out.payload_id), 30.0, "the rejection ack", server
        )
        ack = robots.acks_for(nan_out.payload_id)[0]
        assert (
            not ack.accepted and ack.code == NON_FINITE and "NaN" in ack.reason and ack.round == 0
        )
        robots.publish(nan_out)
        robots.spin_until(
            lambda: len(robots.acks_for(nan_out.payload_id)) == 2, 30.0, "the repeated ack", server
        )

        # Every other rejection class of an update, once: the code reaches the robot in its
        # UpdateAck.
        def refused(out, code: str, forge=None, skip=()):
            robots.publish(out, forge=forge, skip=skip)
            robots.spin_until(
                lambda: robots.acks_for(out.payload_id), 30.0, f"the {code} ack", server
            )
            ack = robots.acks_for(out.payload_id)[0]
            assert not ack.accepted and ack.code == code and ack.reason, (
                code,
                ack.code,
                ack.reason,
            )
            return out.payload_id

        first = next(iter(initial))
        matrix = next(k for k, v in initial.items() if v.ndim == 2)
        flat = {
            k: (v.reshape(-1) if k == matrix else v) for k, v in initial.items()
        }  # same bytes, wrong shape
        huge = {k: v.copy() for k, v in initial.items()}
        huge[first].reshape(-1)[0] = -1e30
        r0 = robots.ros_out
        side = TransferSender("ros", chunk_bytes=64 << 10)  # its chunks are not re-sent on request
        refused_pids = [nan_out.payload_id] + [
            refused(*case)
            for case in (
                (robots.prepare(r0, flat, "robot_1", "shape"), SCHEMA),
                (
                    robots.prepare(r0, dict(list(initial.items())[:-1]), "robot_1", "manifest"),
                    SCHEMA,
                ),
                (robots.prepare(r0, huge, "robot_1", "range"), OUT_OF_RANGE),
                (
                    robots.prepare(r0, initial, "robot_1", "oversize"),
                    OVERSIZE,
                    lambda m: setattr(m.payload, "total_bytes", 1 << 40),
                ),
                (
                    robots.prepare(r0, initial, "robot_1", "digest"),
                    DIGEST,
                    lambda m: setattr(m.payload, "sha256", "0" * 64),
                ),
                (robots.prepare(r0, initial, "robot_1", "samples", num_samples=0), NUM_SAMPLES),
                (robots.prepare(r0, initial, "robot_9", "stranger"), NOT_PARTICIPANT),
                (robots.prepare(r0, initial, "robot_1", "future", round_idx=1), FUTURE),
                (robots.prepare(r0, initial, "robot_1", "base", base_round=1), STALE_BASE),
            )
        ]

        # A second update of robot_0 in flight (its first chunk passed the header checks) completes
        # after robot_0's update below was accepted: refused by the round as a duplicate, counted
        # once.
        twin = robots.prepare(
            side, {k: (v - 0.02).astype(np.float32) for k, v in initial.items()}, "robot_0", "twin"
        )
        robots.publish(twin, skip=set(range(1, len(twin.chunks()))))
        # An update whose first publication is lost: the outbox re-sends it until acknowledged.
        good0 = {k: (v + 0.01).astype(np.float32) for k, v in initial.items()}
        lost = robots.prepare(robots.auto_out, good0, "robot_0", "lost")
        assert lost.channel == "zmq"  # the update goes over the bulk channel too
        entry = robots.outbox.add(
            0, lost.payload_id, lost, deadline=time.monotonic() + 120.0
        )  # never published
        robots.spin_until(
            lambda: robots.acks_for(lost.payload_id), 60.0, "the re-sent update's ack", server
        )
        assert robots.acks_for(lost.payload_id)[0].accepted and entry.sends >= 2
        robots.resend_from.append(side)  # from now on the twin's lost chunks are re-sent too
        refused_pids.append(refused(twin, DUPLICATE, skip={0}))
        # A second, different update of a robot whose update the round already took.
        good1 = {k: (v - 0.01).astype(np.float32) for k, v in initial.items()}
        refused_pids.append(refused(robots.prepare(r0, good1, "robot_0", "again"), DUPLICATE))

        # An interrupted chunk stream: chunks 2 and 3 never arrive; the server asks, only they are
        # resent.
        cut = robots.prepare(robots.ros_out, good1, "robot_1", "cut")
        assert len(cut.chunks()) > 4
        robots.publish(cut, skip={2, 3})
        robots.spin_until(
            lambda: robots.acks_for(cut.payload_id), 60.0, "the resumed update's ack", server
        )
        assert robots.acks_for(cut.payload_id)[0].accepted
        assert any('"chunks": [2, 3]' in r for r in robots.resend_requests), robots.resend_requests

        # The round completes with each update counted once; a late re-send is acknowledged again
        # only.
        robots.spin_until(lambda: 0 in robots.reports, 60.0, "round 0's report", server)
        robots.publish(lost)
        robots.spin_until(
            lambda: len(robots.acks_for(lost.payload_id)) >= 2, 30.0, "the re-ack", server
        )
        assert all(a.accepted for a in robots.acks_for(lost.payload_id))
        # Round 1: an update for round 0, which is over, is refused as stale (and counted in round
        # 1).
        robots.spin_until(lambda: robots.announcement.round == 1, 30.0, "round 1", server)
        stale_pid = refused(robots.prepare(r0, good1, "robot_1", "stale"), STALE_ROUND)
        for k, rid in enumerate(ROBOTS):
            out = robots.prepare(
                r0,
                {n: (v + 0.02 * (k + 1)).astype(np.float32) for n, v in initial.items()},
                rid,
                "r1",
                round_idx=1,
            )
            robots.publish(out)
            robots.spin_until(
                lambda: robots.acks_for(out.payload_id), 60.0, f"{rid}'s round 1 ack", server
            )
            assert robots.acks_for(out.payload_id)[0].accepted
        robots.spin_until(lambda: 1 in robots.reports, 60.0, "round 1's report", server)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n--- server log ---\n{log()}") from None
    finally:
        robots.close()
    # Each update counted once in the round report: 2 accepted, every refused payload id once
    # (the NaN update's re-send is not counted again).
    report = robots.reports[0]
    counts = (report.updates_received, report.updates_accepted, report.updates_rejected)
    assert report.completed and counts == (2 + len(refused_pids), 2, len(refused_pids)), counts
    report1 = robots.reports[1]
    assert (report1.updates_received, report1.updates_accepted, report1.updates_rejected) == (
        3,
        2,
        1,
    )
    # The audit log has one entry per decision, with the code the robot received.
    entries = [e for e in read_audit_log(state_dir / "audit.jsonl") if e["kind"] == "update"]
    applied = [e for e in entries if e["accepted"] and e["round"] == 0]
    assert sorted(e["robot_id"] for e in applied) == ROBOTS  # each accepted exactly once
    codes = {
        e["payload_id"]: e["code"] for e in entries if not e["accepted"] and e["code"] != "replay"
    }
    assert codes == {pid: robots.acks_for(pid)[0].code for pid in refused_pids + [stale_pid]}, codes
    assert sorted(codes.values()) == sorted(
        [
            NON_FINITE,
            SCHEMA,
            SCHEMA,
            OUT_OF_RANGE,
            OVERSIZE,
            DIGEST,
            NUM_SAMPLES,
            NOT_PARTICIPANT,
            FUTURE,
            STALE_BASE,
            DUPLICATE,
            DUPLICATE,
            STALE_ROUND,
        ]
    )


@pytest.mark.timeout(200)
def test_max_attempts_ends_the_run_with_a_clear_message_and_the_robots_told(
    tmp_path: Path, ros_env, processes
) -> None:
    """Registered robots that never answer: round 0 is abandoned at each short deadline, announced
    again, and after ``max_attempts`` the server gives up: exit code 1, an error naming the round,
    the attempts and the reason, and every abandonment reported to the robots (RoundReport)."""
    from fed_ros.learning.configuration_policy import PolicyConfig
    from fed_ros.core.params import manifest_of
    from fed_ros.learning.trainer import initial_state_dict

    server = processes.start(
        [
            sys.executable,
            "-m",
            "fed_ros.ros.nodes.server.server_node",
            "--ros-args",
            "-r",
            "__ns:=/fleet",
            "-p",
            "algorithm:=fedavg",
            "-p",
            "rounds:=2",
            "-p",
            f"state_dir:={tmp_path / 'server'}",
            "-p",
            f"expected_robots:=[{','.join(ROBOTS)}]",
            "-p",
            "round_timeout_s:=4.0",
            "-p",
            "max_attempts:=2",
            "-p",
            "seed:=0",
        ],
        ros_env,
        log_path=tmp_path / "server.log",
    )
    robots = Robots(manifest_of(initial_state_dict(PolicyConfig(kind="lowdim"), seed=0)))
    try:
        robots.register_all()
        robots.spin_until(lambda: server.poll() is not None, 120.0, "the server to give up")
        robots.spin_until(lambda: len(robots.report_log) >= 2, 10.0, "both abandonment reports")
    finally:
        robots.close()
    log = (tmp_path / "server.log").read_text()
    assert server.returncode == 1, log[-3000:]
    assert "giving up: round 0 abandoned 2 times: below quorum: 0 of 2 required answers" in log, (
        log[-3000:]
    )
    assert [(r.round, r.completed, r.updates_received) for r in robots.report_log] == [
        (0, False, 0)
    ] * 2
    assert all(r.status.startswith("abandoned: below quorum") for r in robots.report_log)
    assert all(
        m.reason == "straggler: no update by the deadline"
        for r in robots.report_log
        for m in r.robots
    )
    assert "announced round 1" not in log and not list((tmp_path / "server").glob("round_*"))
