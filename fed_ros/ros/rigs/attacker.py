"""A hostile DDS peer (its own process: rclpy + the generated fed_ros types), shared by the
hostile-peer suite (test/slow/test_hostile_peers.py) and `fed-ros bench robustness --protocol`.

``python -m fed_ros.ros.rigs.attacker <keys_dir> [--round R] <attack>[:<n>] ...`` prints one JSON
line per attack: {"attack", "sent", "accepted", "reasons"} (service answers) or {"attack", "sent"}
(published messages; forged updates also list their "payload_ids"). ``--round`` is the round the
forged / unsigned updates claim (default 0; n updates claim R .. R+n-1).

It holds only its own key pair and the robots' PUBLIC keys (from the allow-list), as a real
intruder on the fleet network could.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import rclpy
from rclpy.duration import Duration
from rclpy.executors import SingleThreadedExecutor
from std_msgs.msg import String

from fed_ros.core.security import auth
from fed_ros.core.security import signed_messages
from fed_ros.msg import ModelUpdate
from fed_ros.ros.wire import qos
from fed_ros.ros.wire.register import register_request
from fed_ros.srv import Register

MB = 1 << 20


class Attacker:
    def __init__(self, keys_dir: Path, round_idx: int = 0) -> None:
        rclpy.init()
        self.round_idx = round_idx  # the round forged / unsigned updates claim
        self.node = rclpy.create_node("intruder")
        self.ex = SingleThreadedExecutor()
        self.ex.add_node(self.node)
        self.allow = auth.AllowList.from_yaml(keys_dir / "allow_list.yaml")
        self.thief = auth.Signer.generate()
        self.keys_dir = keys_dir
        self.client = self.node.create_client(Register, "/fleet/register")
        self.updates = self.node.create_publisher(ModelUpdate, "/fleet/updates", qos.control_qos())
        self.resend = self.node.create_publisher(String, "/fleet/model_resend", qos.control_qos())

    def call(self, request, timeout: float = 20.0):
        """The server's answer (asked again while unanswered: every attack request is refused
        whether it arrives once or twice), or None."""
        from fed_ros.ros.wire.service_calls import call_client_until_answered, spinning

        try:
            wait = spinning(lambda s: self.ex.spin_once(timeout_sec=s))
            return call_client_until_answered(
                self.client, request, wait, attempt_s=5.0, timeout_s=timeout
            )
        except TimeoutError:
            return None

    def wait_matched(self, pub, timeout: float = 30.0) -> None:
        end = time.monotonic() + timeout
        while pub.get_subscription_count() == 0 and time.monotonic() < end:
            self.ex.spin_once(timeout_sec=0.05)

    def registrations(self, name: str, requests) -> dict:
        assert self.client.wait_for_service(timeout_sec=30.0)
        answers = [self.call(r) for r in requests]
        return {
            "attack": name,
            "sent": len(answers),
            "answered": sum(a is not None for a in answers),
            "accepted": sum(bool(a and a.accepted) for a in answers),
            "reasons": sorted(
                {a.reason[:120] for a in answers if a is not None and not a.accepted}
            )[:3],
        }

    def run(self, attack: str, n: int) -> dict:
        victim = "robot_0"
        if attack == "register_flood":  # unknown ids, each properly signed with the intruder's key
            return self.registrations(
                attack,
                (
                    register_request(f"intruder_{i}", tasks=["lift"], signer=self.thief)
                    for i in range(n)
                ),
            )
        if attack == "register_wrong_key":  # a real id with the intruder's key
            return self.registrations(
                attack, [register_request(victim, tasks=["stack"], signer=self.thief)]
            )
        if (
            attack == "register_no_proof"
        ):  # a real id with its PUBLIC key: overwrite its capabilities
            req = register_request(victim, tasks=["stack"], num_samples=10**6, has_gpu=True)
            req.public_key = list(self.allow.public_key(victim))
            return self.registrations(attack, [req])
        if attack == "register_replay":  # a captured, valid signed request sent again
            captured = json.loads((self.keys_dir / "captured_register.json").read_text())
            req = Register.Request(
                robot_id=captured["robot_id"],
                tasks=captured["tasks"],
                action_dim=captured["action_dim"],
                num_samples=captured["num_samples"],
                timestamp_ns=captured["timestamp_ns"],
            )
            req.public_key, req.nonce, req.signature = (
                list(bytes.fromhex(captured[k])) for k in ("public_key", "nonce", "signature")
            )
            return self.registrations(attack, [req])
        if (
            attack == "junk_burst"
        ):  # 1 MB ids (the .msg bound is not enforced by DDS: bypass the setter)
            self.wait_matched(self.updates)
            for i in range(n):
                msg = ModelUpdate()
                msg._robot_id = f"{i:08d}" + "r" * MB
                msg.payload._payload_id = f"{i:08d}" + "p" * MB
                msg.round = 0
                self.updates.publish(msg)
                if i % 50 == 49:
                    self.ex.spin_once(timeout_sec=0.0)
            # Reliable KEEP_ALL: wait until the server acknowledged every sample (an exiting
            # writer drops what it has not delivered yet).
            acked = self.updates.wait_for_all_acked(Duration(seconds=180))
            return {"attack": attack, "sent": n, "acked": bool(acked)}
        if attack in (
            "forged_update",
            "unsigned_update",
        ):  # current-looking update for a real robot
            from fed_ros.ros.wire.round_msgs import model_update_msg
            from fed_ros.ros.wire.tensors import encode_state_dict
            from fed_ros.ros.wire.chunk_sender import ChunkedSender

            self.wait_matched(self.updates)
            # The fleet's own manifest (the policy architecture is public): its initial model x -10.
            # Only the signature tells this update from the victim's.
            from fed_ros.ros.rigs.scripted import initial_model

            params = {name: (-10.0 * a).astype(np.float32) for name, a in initial_model().items()}
            encoded = encode_state_dict(params)
            payload_ids = []
            for r in range(self.round_idx, self.round_idx + n):
                nonce = signed_messages.new_nonce()
                sig = (
                    b""
                    if attack == "unsigned_update"
                    else self.thief.sign_update(
                        r,
                        victim,
                        nonce,
                        encoded.sha256,
                        base_round=r,
                        num_samples=100,
                        cluster_id=-1,
                    )
                )
                payload_ids.append(f"{victim}/r{r}/forged{nonce.hex()[:6]}")
                for chunk in ChunkedSender(encoded, payload_ids[-1]).chunks():
                    self.updates.publish(
                        model_update_msg(
                            chunk,
                            robot_id=victim,
                            round_idx=r,
                            base_round=r,
                            num_samples=100,
                            nonce=nonce,
                            signature=sig,
                        )
                    )
            self.updates.wait_for_all_acked(Duration(seconds=30))
            return {"attack": attack, "sent": n, "payload_ids": payload_ids}
        if (
            attack == "foreign_chunk"
        ):  # watch honest uploads; inject a forged continuation chunk into n of them
            seen: set[str] = set()
            injected: list[str] = []

            def on_update(msg) -> None:
                p = msg.payload
                if (
                    p.payload_id == "probe"
                ):  # the test's handshake: we hear the honest robots' writer
                    (self.keys_dir / "foreign_chunk.heard").write_text("1")
                    return
                print(
                    f"heard {p.payload_id[:40]} chunk {p.chunk_index}/{p.chunk_count}",
                    file=sys.stderr,
                    flush=True,
                )
                if (
                    p.payload_id in seen
                    or int(p.chunk_count) < 2
                    or int(p.chunk_index) != 0
                    or len(injected) >= n
                ):
                    return
                seen.add(p.payload_id)
                forged = ModelUpdate()
                forged.robot_id, forged.round, forged.base_round = (
                    msg.robot_id,
                    msg.round,
                    msg.base_round,
                )
                forged.num_samples, forged.nonce, forged.signature = (
                    msg.num_samples,
                    msg.nonce,
                    msg.signature,
                )
                forged.payload = p
                size = min(len(p.data), int(p.total_bytes) - len(p.data))
                forged.payload.chunk_index, forged.payload.chunk_offset = 1, len(p.data)
                forged.payload.data = bytes(size)  # zeros where the honest chunk 1 goes
                self.updates.publish(forged)
                injected.append(p.payload_id)
                print(f"injected chunk 1 into {p.payload_id}", file=sys.stderr, flush=True)

            self.wait_matched(
                self.updates
            )  # the server's reader (before our own reader exists: it would count)
            sub = self.node.create_subscription(
                ModelUpdate, "/fleet/updates", on_update, qos.control_qos()
            )
            (self.keys_dir / "foreign_chunk.ready").write_text("1")
            end = time.monotonic() + 120.0
            while len(injected) < n and time.monotonic() < end:
                self.ex.spin_once(timeout_sec=0.05)
            self.updates.wait_for_all_acked(Duration(seconds=30))
            self.node.destroy_subscription(sub)
            return {"attack": attack, "sent": len(injected), "payload_ids": injected}
        if attack == "resend_flood":
            self.wait_matched(self.resend)
            for i in range(n):
                self.resend.publish(
                    String(data=json.dumps({"payload_id": f"cluster_0/r0/{i:012x}", "chunks": [0]}))
                )
            self.resend.wait_for_all_acked(Duration(seconds=30))
            return {"attack": attack, "sent": n}
        raise SystemExit(f"unknown attack {attack!r}")


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m fed_ros.ros.rigs.attacker", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "keys_dir", type=Path, help="holds allow_list.yaml (and captured_register.json)"
    )
    parser.add_argument(
        "--round", type=int, default=0, help="round claimed by forged / unsigned updates"
    )
    parser.add_argument("attacks", nargs="+", help="<attack>[:<n>]")
    args = parser.parse_args(argv)
    attacker = Attacker(args.keys_dir, args.round)
    try:
        for spec in args.attacks:
            name, _, count = spec.partition(":")
            print(json.dumps(attacker.run(name, int(count or 1))), flush=True)
        attacker.ex.spin_once(timeout_sec=0.5)  # let the last samples leave
    finally:
        attacker.node.destroy_node()
        rclpy.try_shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
