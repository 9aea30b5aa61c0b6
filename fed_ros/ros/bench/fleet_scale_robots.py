"""Many virtual robots in one process for `fed-ros bench fleet-scale`: one rclpy node, real keys.

``python -m fed_ros.ros.bench.fleet_scale_robots <spec.json>`` hosts the robots the spec lists
(written by :mod:`fed_ros.ros.bench.fleet_scale`). Each one registers with its own Ed25519 key
(signed Register request), takes its cluster's model of the announced round from the server
(the fleet's TransferReceiver: ROS chunks or the zmq bulk channel), and answers the TRAIN
announcement with a signed update of the policy's real size, encoded by the fleet's own
``encode_state_dict`` (``int8_delta``: the delta against the model it started from, as
robot_update_encoding does in a robot's first round, where the error feedback is still zero) and
sent by the fleet's TransferSender. Training is replaced by a synthetic update with a family
structure (:class:`SyntheticUpdates`), so the clusters the server should find are known.

The virtual robots share one subscription per topic: a cluster model reaches the process once,
for all of its robots (a real fleet sends it to each robot). Behaviours (spec ``faults``):
``vanish`` sends at most the first chunk and then nothing; ``shape`` / ``nan`` / ``badsig`` /
``oversized`` send one hostile update (wrong tensor shape, a NaN, a signature that does not
verify, a manifest 4x the model's); ``storm`` sends its honest update and re-registers
``storm_count`` times. Every wait is bounded in count and time (the spec's ``timeout_s``).

Prints JSON lines: ``{"event": "registered"}`` once every robot is in, then one ``"done"`` line
with what was measured (times are wall-clock ``time.time()``, comparable across processes).
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HOSTILE = ("shape", "nan", "badsig", "oversized")
FAULTS = ("vanish", *HOSTILE, "storm")
# An unacknowledged update is sent again on a robot's schedule (robot parameter update_retry_s
# 2 s, doubling, at most 10 s, spread by the spec's retry_jitter: the robot uplink's RetrySchedule)
# until the announced round's deadline, as the robot node's outbox keeps it; MAX_SENDS bounds the
# count as well (a 600 s round allows ~65 sends at the jittered 10 s). Until 2026-12-07 the
# generator gave up after 8 sends (~54 s), which no robot node does: at N = 1000 x 11M in float32,
# 3 robots whose offers the busy server's inbox dropped 8 times gave up, and the round waited
# for its 600 s deadline after its 997th update was admitted at 132 s.
RETRY_FIRST_S, RETRY_MAX_S = 2.0, 10.0
MAX_SENDS = 200


def family_of(index: int, families: int) -> int:
    """The family (the cluster the server should find) of virtual robot ``index``."""
    return index % families


# Round-0 updates encoded before the round, per robot process (see `VirtualRobots.prepare`).
PREPARE_MB = 1024
# Updates sent and not yet acknowledged, per robot process. Each real robot holds only its own;
# here hundreds share one machine's memory, and 1000 x 44 MB (the 11M-parameter policy in
# float32) sent faster than the server admits them was killed for memory. A robot whose turn
# comes while its process is over the bound sends when acknowledgements free it (the server's
# admission rate is then what paces the round, as it would anyway). 2048 MB per process queued
# ~190 such updates at the server, more than it admits within a robot's MAX_SENDS (~54 s):
# 94 of 1000 robots gave up, and their unanswered bytes held the last robots back.
UNACKED_MB = 512


class SyntheticUpdates:
    """Robot ``index``'s 'trained' model: ``start`` + its family's direction + its own noise.

    Deterministic in (index, families, round): a run with faults and one without send the
    honest robots' same bytes. The family direction is 4x the noise, so within-family cosine
    ~0.94. The directions (one per family) and a noise bank (one per round) are drawn once per
    process over the whole flattened model; a robot's noise is the bank rotated by an offset of
    its own, so an update costs a few vector operations on P floats rather than 2P normal
    draws, and N = 1000 robots of an 11M-parameter policy fit the generator's processes.
    """

    def __init__(self, families: int) -> None:
        self.families = families
        self._directions: dict[tuple[int, int], np.ndarray] = {}
        self._banks: dict[tuple[int, int], np.ndarray] = {}

    def _direction(self, family: int, size: int) -> np.ndarray:
        key = (family, size)
        if key not in self._directions:
            rng = np.random.default_rng([7, family])
            self._directions[key] = 0.02 * rng.standard_normal(size, dtype=np.float32)
        return self._directions[key]

    def _bank(self, round_idx: int, size: int) -> np.ndarray:
        key = (round_idx, size)
        if key not in self._banks:
            self._banks.clear()  # one round at a time
            rng = np.random.default_rng([11, round_idx])
            self._banks[key] = 0.005 * rng.standard_normal(size, dtype=np.float32)
        return self._banks[key]

    def __call__(
        self, start: dict[str, np.ndarray], index: int, round_idx: int
    ) -> dict[str, np.ndarray]:
        names = list(start)
        flat = np.concatenate([np.asarray(start[n], np.float32).reshape(-1) for n in names])
        size = flat.size
        # Knuth's multiplicative hash: distinct robots, offsets far apart.
        shift = (index * 2654435761 + 1) % size
        flat += self._direction(family_of(index, self.families), size)
        flat += np.roll(self._bank(round_idx, size), shift)
        out, at = {}, 0
        for name in names:
            shape = np.shape(start[name])
            count = int(np.prod(shape))
            out[name] = flat[at : at + count].reshape(shape)
            at += count
        return out


def params_digest(params: dict[str, np.ndarray]) -> str:
    """SHA-256 over a model's tensors in name order (names, shapes and float32 bytes)."""
    h = hashlib.sha256()
    for name in sorted(params):
        a = np.ascontiguousarray(params[name], dtype=np.float32)
        h.update(name.encode())
        h.update(repr(a.shape).encode())
        h.update(a.tobytes())
    return h.hexdigest()


class VirtualRobots:
    """The spec's robots behind one rclpy node (see the module docstring)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        import rclpy
        from rclpy.executors import SingleThreadedExecutor
        from std_msgs.msg import String

        from fed_ros.core.security import auth
        from fed_ros.msg import ClusterModel, ModelUpdate, RoundAnnouncement, RoundReport
        from fed_ros.msg import UpdateAck
        from fed_ros.ros.wire import qos
        from fed_ros.ros.wire.transfer import TransferSender
        from fed_ros.srv import Register

        self.spec = spec
        keys = Path(spec["keys_dir"])
        self.robots: list[tuple[int, str, str]] = [tuple(r) for r in spec["robots"]]
        self.signers = {
            rid: auth.Signer.from_file(keys / f"{rid}.key") for _, rid, _ in self.robots
        }
        self.server_key = auth.Signer.from_file(keys / "server.key").public_key
        self.families = int(spec["families"])
        self.encoding = str(spec["encoding"])
        self.synthetic = SyntheticUpdates(self.families)
        self.deadline = time.monotonic() + float(spec["timeout_s"])
        rclpy.init()
        self.node = rclpy.create_node(f"virtual_robots_{spec['worker']}")
        self.ex = SingleThreadedExecutor()
        self.ex.add_node(self.node)
        self.sender = TransferSender(
            spec["channel"], keep=max(16, 2 * len(self.robots)), bulk_ttl_s=3600.0
        )
        self.receiver = None  # the TransferReceiver, once the first model tells the manifest
        self.pub = self.node.create_publisher(ModelUpdate, "/fleet/updates", qos.control_qos())
        self.client = self.node.create_client(Register, "/fleet/register")
        self.node.create_subscription(
            RoundAnnouncement, "/fleet/round", self._on_round, qos.latched_qos()
        )
        self.node.create_subscription(
            RoundReport, "/fleet/round_report", self._on_report, qos.latched_qos()
        )
        self.node.create_subscription(
            ClusterModel, "/fleet/cluster_models", self._on_model, qos.model_state_qos(64)
        )
        self.node.create_subscription(
            UpdateAck, "/fleet/update_acks", self._on_ack, qos.control_qos()
        )
        self.node.create_subscription(
            String, "/fleet/update_resend", self._on_resend, qos.control_qos()
        )
        self.announcement = None  # the TRAIN Announcement answered
        self.announced_at = 0.0  # its header stamp (the server's clock = this machine's)
        self.report = None
        self.models: dict[tuple[int, int], tuple[dict, str, float]] = {}  # (cid, round) -> ...
        self.bytes_in = 0  # payload bytes of cluster-model chunks received (or fetched)
        self.bytes_out = 0  # payload bytes of update chunks sent (re-sends included)
        self.acks: dict[str, tuple[bool, str]] = {}  # payload id -> (accepted, code)
        from fed_ros.core.rounds.delivery import RetrySchedule
        from fed_ros.ros.nodes.robot.uplink import UPDATE_RESEND_JITTER

        self.retry = RetrySchedule(
            first_s=RETRY_FIRST_S,
            max_s=RETRY_MAX_S,
            jitter=float(spec.get("retry_jitter", UPDATE_RESEND_JITTER)),
        )
        self._draws = np.random.default_rng([13, int(spec["worker"])])
        self.outbox: dict[str, tuple[Any, int, float]] = {}  # pid -> (Outgoing, sends, due at)
        self.outbox_bytes: dict[str, int] = {}  # pid -> payload bytes, until acknowledged
        self.unacked_budget = float(self.spec.get("unacked_mb", UNACKED_MB)) * 2**20
        self.storm_answers: list[bool] = []
        self.prepared: dict[tuple[str, int, int], Any] = {}  # (robot, cluster, round) -> payload
        self.prepared_used = 0
        self.offered: set[str] = set()  # payload ids offered on the bulk channel
        self.resent = 0  # whole updates sent again for want of an acknowledgement
        self.chunks_resent = 0  # chunks sent again on the server's request
        self.prepared_start = ""  # digest of the model the prepared updates start from
        self.sent_at = 0.0  # when the last update of this process left (time.time())

    # ----------------------------------------------------------------- callbacks

    def _on_round(self, msg) -> None:
        from fed_ros.ros.wire.round_msgs import announcement_from_msg

        ann = announcement_from_msg(msg)
        if ann.stage == "train" and self.announcement is None:
            self.announcement = ann
            self.announced_at = msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9

    def _on_report(self, msg) -> None:
        if self.announcement is not None and int(msg.round) == self.announcement.round_idx:
            self.report = msg

    def _on_ack(self, msg) -> None:
        pid = str(msg.payload_id)
        self.acks[pid] = (bool(msg.accepted), str(msg.code))
        # The server holds it: drop the payload (a robot's own uplink keeps only what is not
        # acknowledged; here N robots share one process's memory).
        self.outbox_bytes.pop(pid, None)
        if self.outbox.pop(pid, None) is not None:
            self.sender.withdraw(pid)

    def _on_resend(self, msg) -> None:
        from fed_ros.ros.wire.round_msgs import model_update_msg
        from fed_ros.ros.wire.signed import verify_json

        if verify_json(msg.data, "update_resend", lambda obj: self.server_key) is not None:
            return  # not from our server
        try:
            answer = self.sender.resend(msg.data)
        except ValueError:
            return
        if answer is not None:
            out, chunks = answer
            for chunk in chunks:
                self._publish(model_update_msg(chunk, **out.meta), chunk)
            self.chunks_resent += len(chunks)

    def _on_model(self, msg) -> None:
        from fed_ros.ros.wire.tensors import manifest_from_msgs

        if self.receiver is None:
            from fed_ros.ros.wire.transfer_receiver import TransferReceiver

            self.receiver = TransferReceiver(
                manifest_from_msgs(msg.payload.manifest), max_pending=16
            )
        self._take(self.receiver.offer(msg.payload, tag=(int(msg.cluster_id), int(msg.round))))

    def _take(self, received) -> None:
        if received is None or not received.decision.accepted:
            return
        self.bytes_in += received.nbytes
        self.models[received.tag] = (received.params, params_digest(received.params), time.time())

    # ------------------------------------------------------------------- actions

    def spin(self, seconds: float) -> None:
        """Spin for ``seconds`` (bulk fetches finished meanwhile are taken)."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.ex.spin_once(timeout_sec=0.01)
            if self.receiver is not None:
                for received in self.receiver.completed():
                    self._take(received)

    def _left(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"worker {self.spec['worker']}: spec timeout_s ran out")
        return left

    def register(self, rid: str) -> bool:
        """One signed Register call for ``rid`` (asked again while unanswered): accepted?"""
        from fed_ros.ros.wire.register import register_request
        from fed_ros.ros.wire.service_calls import call_client_until_answered, spinning

        answer = call_client_until_answered(
            self.client,
            lambda: register_request(
                rid, tasks=["lift"], num_samples=100, signer=self.signers[rid]
            ),
            spinning(lambda s: self.ex.spin_once(timeout_sec=s)),
            attempt_s=10.0,
            timeout_s=min(60.0, self._left()),
        )
        return bool(answer.accepted)

    def register_all(self) -> None:
        end = time.monotonic() + min(60.0, self._left())
        while not self.client.wait_for_service(timeout_sec=0.5):
            if time.monotonic() > end:
                raise TimeoutError("no /fleet/register service")
        for _, rid, _ in self.robots:
            if not self.register(rid):
                raise RuntimeError(f"registration of {rid} refused")

    def _publish(self, msg, chunk) -> None:
        self.pub.publish(msg)
        # A bulk offer carries no bytes: its payload is counted once, when first offered (the
        # server fetches it once; a fetch is not seen here).
        self.bytes_out += len(chunk.data)
        if chunk.bulk_uri and chunk.payload_id not in self.offered:
            self.offered.add(chunk.payload_id)
            self.bytes_out += int(chunk.total_bytes)

    def _start_model(self, rid: str) -> tuple[int, dict]:
        """(cluster, model) robot ``rid`` starts from: its cluster's model of the round."""
        ann = self.announcement
        cid = ann.memberships[rid][0][0]
        key = (cid, ann.round_idx)
        while key not in self.models:
            self._left()
            self.spin(0.05)
        return cid, self.models[key][0]

    def send_updates(self) -> None:
        """Answer the TRAIN announcement for every participant of this process."""
        from fed_ros.ros.wire.publish import wait_for_subscribers

        wait_for_subscribers(self.node, self.pub, "/fleet/updates", timeout=min(30.0, self._left()))
        ann = self.announcement
        spread = float(self.spec.get("spread_s", 0.0))
        # Robots finish training at different times: robot k sends spread_s x frac(k x golden
        # ratio) after the announcement (deterministic, evenly spread); 0: all at once.
        order = sorted(self.robots, key=lambda r: (r[0] * 0.6180339887) % 1.0 if spread else 0)
        for index, rid, fault in order:
            if rid not in ann.participants:
                continue
            due = self.announced_at + spread * ((index * 0.6180339887) % 1.0)
            while spread and time.time() < due:
                self._left()
                self.spin(min(0.05, max(due - time.time(), 0.0)))
                self.resend_due()
            while sum(self.outbox_bytes.values()) > self.unacked_budget:
                self._left()
                self.spin(0.05)
                self.resend_due()
            cid, start = self._start_model(rid)
            self._send_one(index, rid, fault, cid, start)
            self.ex.spin_once(timeout_sec=0.0)  # keep acks and resend requests flowing
        self.sent_at = time.time()
        for index, rid, fault in self.robots:
            if fault == "storm" and rid in ann.participants:
                for _ in range(int(self.spec.get("storm_count", 10))):
                    self.storm_answers.append(self.register(rid))

    def encode(self, index: int, fault: str, start: dict, round_idx: int) -> Any:
        """Robot ``index``'s 'training' result for ``round_idx`` from ``start``, encoded."""
        from fed_ros.ros.wire.tensors import encode_state_dict

        trained = self.synthetic(start, index, round_idx)
        encoding = self.encoding
        if fault in ("shape", "nan", "oversized"):
            encoding = "float32"  # the hostile payloads are dense models
            first = next(iter(trained))
            if fault == "shape":
                trained[first] = trained[first].reshape(-1)[:-1].copy()
            elif fault == "nan":
                trained[first].reshape(-1)[0] = np.nan
            else:
                total = sum(a.size for a in trained.values())
                trained["zz_oversized"] = np.zeros(4 * total, np.float32)
        if encoding in ("int8_delta", "int4_delta", "topk"):
            return encode_state_dict({n: trained[n] - start[n] for n in trained}, encoding)
        return encode_state_dict(trained, encoding)

    def prepare(self) -> None:
        """Encode every robot's round-0 update before registering (the round starts at the last
        registration).

        Every robot starts round 0 from cluster 0's initial model (FedDRMan's setup), which is
        the policy's seeded initial weights, computed here as the server computes them; an
        update is used only if the model the server then sends has the same digest. So the
        robots' 'training' costs nothing inside the measured round (in a real fleet it runs on
        each robot's own computer, not on this machine's 2 cores). Any other (cluster, round)
        is encoded when announced.
        """
        from fed_ros.learning.configuration_policy import PolicyConfig
        from fed_ros.learning.trainer import initial_state_dict

        start = initial_state_dict(
            PolicyConfig(kind=self.spec["policy"], **self.spec.get("architecture", {})), seed=0
        )
        self.prepared_start = params_digest(start)
        # Bounded: 250 robots x an 11M-parameter float32 update would be 11 GB in one process.
        # The rest are encoded when they are sent (inside the measured round).
        budget, held = float(self.spec.get("prepare_mb", PREPARE_MB)) * 2**20, 0
        for index, rid, fault in self.robots:
            if held >= budget:
                break
            payload = self.encode(index, fault, start, 0)
            self.prepared[(rid, 0, 0)] = payload
            held += payload.total_bytes

    def _send_one(self, index: int, rid: str, fault: str, cid: int, start: dict) -> None:
        import secrets

        from fed_ros.ros.wire.round_msgs import model_update_msg

        r = self.announcement.round_idx
        payload = self.prepared.pop((rid, cid, r), None)
        if payload is not None and self.models[(cid, r)][1] != self.prepared_start:
            payload = None  # the server started from another model than the seeded one
        if payload is None:
            payload = self.encode(index, fault, start, r)
        else:
            self.prepared_used += 1
        nonce = secrets.token_bytes(16)
        pid = f"{rid}/r{r}/update/{nonce.hex()[:8]}"
        fields = dict(
            robot_id=rid, round_idx=r, base_round=r, num_samples=100, cluster_id=cid, nonce=nonce
        )
        out = self.sender.prepare(payload, pid, **fields, signature=b"")
        signature = self.signers[rid].sign_update(
            r,
            rid,
            nonce,
            payload.sha256,
            base_round=r,
            num_samples=100,
            cluster_id=cid,
            transfer=out.chunker.transfer_digest(),
        )
        if fault == "badsig":
            signature = signature[:-1] + bytes([signature[-1] ^ 1])
        out.meta["signature"] = signature
        chunks = out.chunks()
        if fault == "vanish":
            chunks = chunks[:1] if len(chunks) > 1 else []  # gone after its first chunk
        for chunk in chunks:
            self._publish(model_update_msg(chunk, **out.meta), chunk)
        if fault != "vanish":  # like a robot's uplink: re-sent until acknowledged (bounded)
            self.outbox[pid] = (out, 1, time.monotonic() + self._retry_delay(1))
            self.outbox_bytes[pid] = payload.total_bytes

    def _retry_delay(self, sends: int) -> float:
        return self.retry.delay(sends, float(self._draws.random()))

    def resend_due(self) -> None:
        """Updates not acknowledged: sent again on the robot's retry schedule until the round's
        deadline, MAX_SENDS times at most (the server's KEEP_LAST(8) inbox drops chunks of a burst
        of updates)."""
        from fed_ros.ros.wire.round_msgs import model_update_msg

        now = time.monotonic()
        for pid, (out, sends, due) in list(self.outbox.items()):
            if pid in self.acks or now < due:
                continue
            if sends >= MAX_SENDS or time.time() >= self.announcement.deadline_s:
                # The round is over for this update (as a robot's outbox drops it at the deadline).
                del self.outbox[pid]
                self.outbox_bytes.pop(pid, None)  # and no longer holds back the others
                self.sender.withdraw(pid)
                continue
            for chunk in out.chunks():
                self._publish(model_update_msg(chunk, **out.meta), chunk)
            self.outbox[pid] = (out, sends + 1, now + self._retry_delay(sends + 1))
            self.resent += 1

    def done(self) -> bool:
        """The round's report is in and every cluster model it produced has arrived."""
        if self.report is None:
            return False
        nxt = self.announcement.round_idx + 1
        return all((int(c.cluster_id), nxt) in self.models for c in self.report.clusters)

    def result(self) -> dict[str, Any]:
        """What this process measured (the ``done`` line)."""
        ann, rep = self.announcement, self.report
        nxt = ann.round_idx + 1
        clusters = {int(c.cluster_id): list(c.member_robot_ids) for c in rep.clusters}
        return {
            "event": "done",
            "worker": self.spec["worker"],
            "robots": len(self.robots),
            "round": ann.round_idx,
            "announced_at": self.announced_at,
            "sent_at": self.sent_at,
            "prepared_used": self.prepared_used,
            "resent": self.resent,
            "chunks_resent": self.chunks_resent,
            "delivered_at": max(self.models[(c, nxt)][2] for c in clusters),
            "model_digests": {str(c): self.models[(c, nxt)][1] for c in clusters},
            "clusters": {str(c): m for c, m in clusters.items()},
            "aggregation_seconds": float(rep.aggregation_seconds),
            "updates_received": int(rep.updates_received),
            "updates_accepted": int(rep.updates_accepted),
            "updates_rejected": int(rep.updates_rejected),
            "completed": bool(rep.completed),
            "status": str(rep.status),
            "bytes_out": self.bytes_out,
            "bytes_in": self.bytes_in,
            "acks": {pid.split("/")[0]: list(a) for pid, a in self.acks.items()},
            "storm_accepted": sum(self.storm_answers),
            "storm_calls": len(self.storm_answers),
        }

    def run(self) -> dict[str, Any]:
        """Register, answer the TRAIN announcement, wait for the new models (all bounded)."""
        self.prepare()  # before registering: the last registration starts the round
        self.register_all()
        print(json.dumps({"event": "registered", "worker": self.spec["worker"]}), flush=True)
        while self.announcement is None:
            self._left()
            self.spin(0.05)
        self.send_updates()
        while not self.done():
            self._left()
            self.spin(0.05)
            self.resend_due()
        return self.result()

    def close(self) -> None:
        import rclpy

        if self.receiver is not None:
            self.receiver.close()
        self.sender.close()
        self.node.destroy_node()
        rclpy.try_shutdown()


def main(argv: list[str] | None = None) -> int:
    """Run the robots of one spec file; prints the JSON lines."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m fed_ros.ros.bench.fleet_scale_robots <spec.json>", file=sys.stderr)
        return 2
    robots = VirtualRobots(json.loads(Path(args[0]).read_text()))
    try:
        print(json.dumps(robots.run()), flush=True)
    finally:
        robots.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
