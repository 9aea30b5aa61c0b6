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

        from fed_ros.core.delivery import Outbox, RetrySchedule
        from fed_ros.msg import ClusterModel, ModelUpdate, RoundAnnouncement, RoundReport, UpdateAck
        from fed_ros.ros.wire import qos
        from fed_ros.ros.wire.transfer import TransferReceiver, TransferSender
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
        self.pub = self.node.create_publisher(ModelUpdate, "/fleet/updates", qos.control_qos())
        self.node.create_subscription(UpdateAck, "/fleet/update_acks", self._on_ack, qos.control_qos())
        self.node.create_subscription(RoundAnnouncement, "/fleet/round",
                                      lambda m: setattr(self, "announcement", m), qos.latched_qos())
        self.node.create_subscription(RoundReport, "/fleet/round_report",
                                      lambda m: self.reports.__setitem__(int(m.round), m), qos.model_state_qos(16))
        self.node.create_subscription(ClusterModel, "/fleet/cluster_models", self.models.append,
                                      qos.model_state_qos(64))
        self.node.create_subscription(String, "/fleet/update_resend", self._on_resend, qos.control_qos())
        self.client = self.node.create_client(Register, "/fleet/register")

    def _on_ack(self, msg) -> None:
        """What the robot node does: an acknowledged update is not re-sent any more."""
        from fed_ros.core.validation import Decision
        self.acks.append(msg)
        self.outbox.acknowledge(msg.payload_id, Decision(msg.accepted, msg.code, msg.reason))

    def _on_resend(self, msg) -> None:
        """What the robot node does: answer with only the requested chunks."""
        from fed_ros.ros.wire.conversions import model_update_msg
        self.resend_requests.append(msg.data)
        answer = self.ros_out.resend(msg.data)
        if answer is not None:
            out, chunks = answer
            for chunk in chunks:
                self.pub.publish(model_update_msg(chunk, **out.meta))

    def spin_until(self, predicate, timeout: float, what: str, server=None) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            assert server is None or server.poll() is None, f"server died while waiting for {what}"
            self.executor.spin_once(timeout_sec=0.05)
            for entry in self.outbox.due():  # the robot node's _tick: re-send what is unacknowledged
                self.publish(entry.item)

    def register_all(self) -> None:
        assert self.client.wait_for_service(timeout_sec=60.0), "server did not offer /fleet/register"
        for rid in ROBOTS:
            fut = self.client.call_async(self.Register.Request(robot_id=rid, action_dim=4, num_samples=100,
                                                               tasks=["lift"]))
            self.spin_until(fut.done, 30.0, f"registration of {rid}")
            assert fut.result().accepted, fut.result().reason

    def prepare(self, sender, params: dict, rid: str, tag: str):
        return sender.prepare(params, f"{rid}/r0/update/{tag}", robot_id=rid, round_idx=0, base_round=0,
                              num_samples=100)

    def publish(self, out, skip=()) -> None:
        from fed_ros.ros.wire.conversions import model_update_msg
        for chunk in out.chunks():
            if int(chunk.chunk_index) not in skip:
                self.pub.publish(model_update_msg(chunk, **out.meta))

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
    from fed_ros.core.params import manifest_of
    from fed_ros.core.validation import NON_FINITE, read_audit_log
    from fed_ros.learning.configuration_policy import PolicyConfig
    from fed_ros.learning.trainer import initial_state_dict

    initial = initial_state_dict(PolicyConfig(kind="lowdim"), seed=0)
    state_dir = tmp_path / "server"
    server = processes.start(
        [sys.executable, "-m", "fed_ros.ros.nodes.server_node", "--ros-args", "-r", "__ns:=/fleet",
         "-p", "algorithm:=fedavg", "-p", "rounds:=2", "-p", f"state_dir:={state_dir}",
         "-p", f"expected_robots:=[{','.join(ROBOTS)}]", "-p", "round_timeout_s:=200.0",
         "-p", "transfer_channel:=auto", "-p", f"bulk_threshold_bytes:={THRESHOLD}", "-p", "seed:=0"],
        ros_env, log_path=tmp_path / "server.log")
    robots = Robots(manifest_of(initial))
    log = lambda: (tmp_path / "server.log").read_text()[-4000:]  # noqa: E731
    try:
        robots.register_all()
        robots.spin_until(lambda: robots.announcement is not None and robots.announcement.round == 0,
                          60.0, "round 0", server)

        # `auto` above the threshold: the cluster model is one control message with a bulk_uri.
        robots.spin_until(lambda: robots.models, 30.0, "a cluster model", server)
        model = robots.models[0]
        assert model.payload.bulk_uri and len(model.payload.data) == 0, "auto did not switch to bulk"
        assert robots.models_in.offer(model.payload, tag=model) is None
        got = []
        robots.spin_until(lambda: got.extend(robots.models_in.completed()) or got, 30.0, "the model fetch")
        assert got[0].decision, got[0].decision
        assert all(np.array_equal(got[0].params[k], initial[k]) for k in initial)

        # A rejected update: its reason code reaches the robot; a re-send is answered, not re-counted.
        bad = {k: v.copy() for k, v in initial.items()}
        next(iter(bad.values())).reshape(-1)[0] = np.nan
        nan_out = robots.prepare(robots.ros_out, bad, "robot_0", "nan")
        robots.publish(nan_out)
        robots.spin_until(lambda: robots.acks_for(nan_out.payload_id), 30.0, "the rejection ack", server)
        ack = robots.acks_for(nan_out.payload_id)[0]
        assert not ack.accepted and ack.code == NON_FINITE and "NaN" in ack.reason and ack.round == 0
        robots.publish(nan_out)
        robots.spin_until(lambda: len(robots.acks_for(nan_out.payload_id)) == 2, 30.0, "the repeated ack", server)

        # An update whose first publication is lost: the outbox re-sends it until acknowledged.
        good0 = {k: (v + 0.01).astype(np.float32) for k, v in initial.items()}
        lost = robots.prepare(robots.auto_out, good0, "robot_0", "lost")
        assert lost.channel == "zmq"  # the update goes over the bulk channel too
        entry = robots.outbox.add(0, lost.payload_id, lost, deadline=time.monotonic() + 120.0)  # never published
        robots.spin_until(lambda: robots.acks_for(lost.payload_id), 60.0, "the re-sent update's ack", server)
        assert robots.acks_for(lost.payload_id)[0].accepted and entry.sends >= 2

        # An interrupted chunk stream: chunks 2 and 3 never arrive; the server asks, only they are resent.
        good1 = {k: (v - 0.01).astype(np.float32) for k, v in initial.items()}
        cut = robots.prepare(robots.ros_out, good1, "robot_1", "cut")
        assert len(cut.chunks()) > 4
        robots.publish(cut, skip={2, 3})
        robots.spin_until(lambda: robots.acks_for(cut.payload_id), 60.0, "the resumed update's ack", server)
        assert robots.acks_for(cut.payload_id)[0].accepted
        assert any('"chunks": [2, 3]' in r for r in robots.resend_requests), robots.resend_requests

        # The round completes with each update counted once; a late re-send is acknowledged again only.
        robots.spin_until(lambda: 0 in robots.reports, 60.0, "round 0's report", server)
        robots.publish(lost)
        robots.spin_until(lambda: len(robots.acks_for(lost.payload_id)) >= 2, 30.0, "the re-ack", server)
        assert all(a.accepted for a in robots.acks_for(lost.payload_id))
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n--- server log ---\n{log()}") from None
    finally:
        robots.close()
    report = robots.reports[0]
    assert report.completed and (report.updates_received, report.updates_accepted, report.updates_rejected) \
        == (3, 2, 1), (report.updates_received, report.updates_accepted, report.updates_rejected)
    audit = [e for e in read_audit_log(state_dir / "audit.jsonl") if e["kind"] == "update" and e["round"] == 0]
    applied = [e for e in audit if e["accepted"]]
    assert sorted(e["robot_id"] for e in applied) == ROBOTS  # each accepted exactly once
    assert [e["code"] for e in audit if not e["accepted"] and e["code"] != "replay"] == [NON_FINITE]
