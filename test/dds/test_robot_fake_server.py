"""A fake server against a real robot node over DDS (issue 13: server-signed control plane).

The robot node runs as its own process with the fleet's allow-list (which holds the server's
public key); the test is a keyless "server" (an rclpy node) on the fleet's topics. The robot
refuses a cluster model signed with another key and an unsigned one, refuses an unsigned
update_resend request, refuses DONE announcements signed by another key or unsigned, and answers
signed update_resend requests at a bounded rate (10/s, burst 20; the rest refused and counted).
A model and a DONE signed with the real server key are taken, so the refusals are the signature
check's doing (break it: the robot without its allow-list receives the forged model and the test
fails; with announcements signed over raw CDR the robot refused the real server's DONE)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from fed_ros.core.security import auth

from fed_ros.ros.rigs.scripted import make_keys, wait_for
from support.fake_server import FakeServer

pytestmark = pytest.mark.ros


def robot_argv(tmp_path: Path, signed: bool = True) -> list[str]:
    argv = [
        sys.executable,
        "-m",
        "fed_ros.ros.nodes.robot.robot_node",
        "--ros-args",
        "-r",
        "__ns:=/robot_0",
        "-r",
        "__node:=robot",
        "-p",
        "robot_id:=robot_0",
        "-p",
        f"data_dir:={tmp_path / 'r0'}",
        "-p",
        "register_timeout_s:=600.0",
        "-p",
        "torch_threads:=1",
        "-p",
        f"private_key_file:={tmp_path / 'keys' / 'robot_0.key'}",
    ]
    if signed:
        argv += ["-p", f"allowed_keys_file:={tmp_path / 'keys' / 'allow_list.yaml'}"]
    return argv


def refusals(log: Path, kind: str) -> list[tuple[int, str]]:
    """(count so far, reason) of each logged refusal of ``kind`` (the log is rate-limited; counts
    are not)."""
    text = log.read_text(errors="replace") if log.exists() else ""
    return [(int(n), why) for n, why in re.findall(rf"{kind} refused \((\d+) so far\): (.*)", text)]


@pytest.mark.timeout(300)
def test_robot_refuses_a_fake_servers_models_and_resend_requests(tmp_path, ros_env, processes):
    signers = make_keys(tmp_path)
    thief = auth.Signer.generate()
    log = tmp_path / "robot.log"
    robot = processes.start(robot_argv(tmp_path), ros_env, log_path=log)
    fake = FakeServer()
    alive = lambda: robot.poll() is None  # noqa: E731
    try:
        wait_for(
            lambda: (
                fake.models.get_subscription_count() > 0
                and fake.resend.get_subscription_count() > 0
                and fake.rounds.get_subscription_count() > 0
                and fake.refused >= 0
            ),
            120,
            "the robot node's subscriptions and diagnostics",
            poll=fake.spin,
            alive=alive,
        )
        assert fake.refused == 0
        # Cluster models: one signed with a stranger's key, one unsigned. Every chunk is refused on
        # arrival (none is kept: each one is checked as a first chunk), counted once.
        n = fake.send_model(1, thief, "forged")
        wait_for(
            lambda: fake.refused == n, 60, f"{n} forged chunks refused", poll=fake.spin, alive=alive
        )
        assert any("bad server signature" in w for _, w in refusals(log, "cluster_models")), (
            log.read_text()[-2000:]
        )
        fake.send_model(2, None, "unsigned")
        wait_for(
            lambda: fake.refused == 2 * n,
            60,
            f"{n} unsigned chunks refused",
            poll=fake.spin,
            alive=alive,
        )
        # An unsigned update_resend request is refused: the robot never re-sends for a fake server.
        fake.send_resend(None)
        wait_for(
            lambda: fake.refused == 2 * n + 1,
            60,
            "the unsigned resend request refused",
            poll=fake.spin,
            alive=alive,
        )
        # Announcements: a DONE signed by a stranger and an unsigned one are refused; the real
        # server's DONE is obeyed (the robot logs that the federation finished).
        fake.send_done(5, thief)
        wait_for(
            lambda: fake.refused == 2 * n + 2,
            60,
            "the forged announcement refused",
            poll=fake.spin,
            alive=alive,
        )
        fake.send_done(6, None)
        wait_for(
            lambda: fake.refused == 2 * n + 3,
            60,
            "the unsigned announcement refused",
            poll=fake.spin,
            alive=alive,
        )
        fake.send_done(7, signers["server"])
        wait_for(
            lambda: "federation finished at round 7" in log.read_text(),
            60,
            "the real DONE obeyed",
            poll=fake.spin,
            alive=alive,
        )
        assert fake.refused == 2 * n + 3
        # Signed requests (the real server key) in a burst: they pass the signature check, and the
        # rate limit (10/s, burst 20) refuses most of the burst.
        for i in range(100):
            fake.send_resend(signers["server"], i)
        wait_for(
            lambda: (
                any("rate limit" in w for _, w in refusals(log, "update_resend"))
                or fake.refused >= 2 * n + 63
            ),
            60,
            "the resend flood to hit the rate limit",
            poll=fake.spin,
            alive=alive,
        )
        wait_for(
            lambda: fake.refused >= 2 * n + 63,
            60,
            "most of the burst refused",
            poll=fake.spin,
            alive=alive,
        )
        # Positive control: the real server's signature is accepted (so the refusals were the
        # check's); models are handled in order, so round 1 and 2 had their turn before it.
        fake.send_model(3, signers["server"], "real")
        wait_for(
            lambda: "received cluster 0 model for round 3" in log.read_text(),
            60,
            "the validly signed model to be received",
            poll=fake.spin,
            alive=alive,
        )
        wait_for(lambda: fake.refused >= 2 * n + 63, 10, "the count", poll=fake.spin, alive=alive)
        refused_total = fake.refused
    finally:
        fake.close()
    text = log.read_text()
    assert "model for round 1" not in text and "model for round 2" not in text, text[-2000:]
    assert "finished at round 5" not in text and "finished at round 6" not in text
    assert "failed (" not in text, "a handler raised: " + text[text.find("failed (") :][:500]
    # At most burst 20 + 10/s of the 100 signed requests were answered, the rest refused.
    assert 2 * n + 3 + 60 <= refused_total <= 2 * n + 3 + 100, refused_total


def _announcement():
    from fed_ros.core.rounds.config import RoundConfig
    from fed_ros.ros.wire.round_msgs import Announcement, announcement_to_msg

    msg = announcement_to_msg(
        Announcement(
            round_idx=3,
            stage="train",
            deadline_s=1234.5,
            algorithm="feddrman",
            participants=("robot_0", "robot_1"),
            memberships={"robot_0": [(0, 0.25), (1, 0.75)], "robot_1": [(1, 1.0)]},
            quorum=2,
            configs={"robot_0": RoundConfig(lr=1e-3)},
        )
    )
    msg.header.stamp.sec, msg.header.stamp.nanosec = 1796290000, 123
    return msg


MUTATIONS = {
    "round": lambda m: setattr(m, "round", 4),
    "stage": lambda m: setattr(m, "stage", m.STAGE_DONE),
    "stamp": lambda m: setattr(m.header.stamp, "nanosec", 124),
    "deadline": lambda m: setattr(m.deadline, "nanosec", m.deadline.nanosec + 1),
    "algorithm": lambda m: setattr(m, "algorithm", "fedavg"),
    "participants": lambda m: setattr(m, "participants", ["robot_0", "robot_1", "intruder"]),
    "quorum": lambda m: setattr(m, "quorum", 1),
    "weight": lambda m: setattr(m.memberships[0], "weights", [0.25000003, 0.75]),
    "cluster": lambda m: setattr(m.memberships[1], "cluster_ids", [0]),
    "config": lambda m: setattr(m.memberships[0].config, "lr", 2e-3),
}


def test_every_signed_announcement_verifies_as_sent_and_as_received():
    """Signing raw CDR failed: rmw leaves the alignment padding uninitialised, so the bytes signed
    and the bytes re-serialised for checking differed (measured: 1 of 20 DONE announcements failed
    even on the sending object; the real robot node refused the real server's DONE)."""
    from rclpy.serialization import deserialize_message, serialize_message

    from fed_ros.msg import RoundAnnouncement
    from fed_ros.ros.wire.signed import sign_msg, verify_msg

    server = auth.Signer.generate()
    failed = []
    for k in range(50):
        msg = sign_msg(
            RoundAnnouncement(
                round=k,
                stage=RoundAnnouncement.STAGE_DONE,
                algorithm="fedavg",
                participants=["robot_0"],
                quorum=0,
            ),
            "round",
            server,
        )
        received = deserialize_message(serialize_message(msg), RoundAnnouncement)
        failed += [
            k for m in (msg, received) if verify_msg(m, "round", server.public_key) is not None
        ]
    assert failed == []


@pytest.mark.parametrize("mutation", ["none", *MUTATIONS])
def test_signed_announcement_verifies_after_the_wire_and_covers_every_field(mutation):
    """The signature of a full announcement holds for the message as rebuilt from the wire and
    breaks when any field changes."""
    from rclpy.serialization import deserialize_message, serialize_message

    from fed_ros.ros.wire.signed import sign_msg, verify_msg

    server = auth.Signer.generate()
    msg = sign_msg(_announcement(), "round", server)
    received = [deserialize_message(serialize_message(msg), type(msg)) for _ in range(5)]
    if mutation == "none":
        assert verify_msg(msg, "round", server.public_key) is None
        assert all(verify_msg(m, "round", server.public_key) is None for m in received)
        assert "bad server signature" in verify_msg(msg, "round", auth.Signer.generate().public_key)
        assert "bad server signature" in verify_msg(msg, "update_resend", server.public_key)
        return
    MUTATIONS[mutation](received[0])
    assert "bad server signature" in verify_msg(received[0], "round", server.public_key)
