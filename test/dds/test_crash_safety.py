"""L3/L4/P1 crash safety end to end: the server's round logic + model store killed at every commit
step and at random times, then restarted; a robot killed mid-upload.

The "server" here is the real RoundCoordinator over the real ModelStore and strategy (what
`server_node.py` runs), in a forked child process that dies by `os._exit` at an injected commit
step (the store's crash-point hook) or by SIGKILL at a random time - no cleanup, no flush, no
atexit. After every kill a fresh process resumes from the store and finishes the federation;
its cluster models must be bit-identical to an uninterrupted run.
"""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from fed_ros.core.security import auth
from fed_ros.commands.keys import keys_main
from fed_ros.core.security import replay
from fed_ros.core.security import signed_messages
from fed_ros.core.checks.audit_log import read_audit_log
from fed_ros.core.checks.sender_checks import ValidationContext
from fed_ros.core.checks.update_checks import UpdateEnvelope, check_update_envelope, validate_update
from fed_ros.core.params import manifest_of
from fed_ros.core.rounds.store import ModelStore
from fed_ros.core.strategies.base import make_strategy
from fed_ros.core.strategies.types import ClientUpdate
from fed_ros.core.rounds.coordinator import RoundCoordinator
from fed_ros.core.rounds.settings import RoundSettings

ROBOTS = [f"robot_{k}" for k in range(4)]
ROUNDS = 4
INITIAL = {
    "enc.weight": np.linspace(-1, 1, 64 * 32, dtype=np.float32).reshape(64, 32),
    "enc.bias": np.zeros(32, np.float32),
}
KILLED = 137


def local_update(model: dict[str, np.ndarray], round_idx: int, k: int) -> dict[str, np.ndarray]:
    """Deterministic 'local training' of robot k in a round: start model + a seeded step."""
    rng = np.random.default_rng([round_idx, k])
    return {n: (a + rng.normal(0, 0.1, a.shape)).astype(np.float32) for n, a in model.items()}


def make_coordinator(
    store_dir: Path, crash_point=None, algorithm: str = "fedavg"
) -> RoundCoordinator:
    store = ModelStore(store_dir, keep=ROUNDS + 1, _crash_point=crash_point)
    coord = RoundCoordinator(
        make_strategy(algorithm),
        store,
        RoundSettings(algorithm=algorithm, rounds=ROUNDS, round_timeout_s=1e6),
        INITIAL,
        clock=lambda: 0.0,
    )
    if not coord.resume():
        for k, rid in enumerate(ROBOTS):
            assert coord.roster.register(rid, num_samples=10 + k).accepted
    return coord


def run_federation(store_dir: Path, crash_point=None, step_delay: float = 0.0) -> RoundCoordinator:
    """Resume from the store (if anything is committed) and run the remaining rounds."""

    def hook(step: str) -> None:
        if crash_point is not None:
            crash_point(step)
        if step_delay:
            time.sleep(step_delay)  # widens the commit window for the random-kill test

    coord = make_coordinator(store_dir, hook)
    while not coord.finished:
        plan = coord.start_round(now=0.0)
        for k, rid in enumerate(plan.participants):
            upd = ClientUpdate(
                robot_id=rid,
                params=local_update(coord.strategy.model_for(rid), plan.round_idx, k),
                num_samples=10 + k,
                base_round=plan.round_idx,
            )
            upd.round_idx = plan.round_idx
            assert coord.offer_update(upd, now=0.0).accepted
        coord.poll(now=0.0)
    return coord


def models_bytes(store_dir: Path, round_idx: int | None = None) -> dict:
    store = ModelStore(store_dir, keep=ROUNDS + 1)
    snap = store.load_latest() if round_idx is None else store.load_round(round_idx)
    assert snap is not None
    return {
        "round": int(snap.round_idx),
        "models": {
            c: {n: a.tobytes() for n, a in m.items()} for c, m in snap.cluster_models.items()
        },
        "assignments": {r: [tuple(x) for x in m] for r, m in snap.assignments.items()},
    }


def in_child(fn) -> int:
    """Run fn() in a forked child; returns its exit status (KILLED when it died at a crash
    point)."""
    pid = os.fork()
    if pid == 0:  # child: never returns into pytest
        code = 0
        try:
            fn()
        except BaseException:  # noqa: BLE001
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[Path, list[str]]:
    """An uninterrupted federation, and the commit steps the store goes through."""
    steps: list[str] = []
    ref = tmp_path_factory.mktemp("reference")
    run_federation(ref, crash_point=steps.append)
    per_commit = steps[: steps.index("committed") + 1]
    assert per_commit[0] == "begin" and "renamed:manifest" in per_commit
    return ref, per_commit


def test_l3_kill_at_every_commit_step_resumes_with_identical_models(reference, tmp_path):
    ref, steps = reference
    final = models_bytes(ref)
    assert final["round"] == ROUNDS - 1
    for i, step in enumerate(steps):
        store_dir = tmp_path / f"kill_{i}"

        def crash(s: str, step=step, seen=[0]) -> None:  # noqa: B006 - per-child counter
            if s == "begin":
                seen[0] += 1
            if s == step and seen[0] == 2:  # die inside the commit of round 1
                os._exit(KILLED)

        assert in_child(lambda: run_federation(store_dir, crash)) == KILLED, step
        # The last good version is loadable and intact: round 0, or round 1 once its manifest is in
        # place.
        after = models_bytes(store_dir)
        committed = steps.index(step) >= steps.index("renamed:manifest")
        assert after["round"] == (1 if committed else 0), step
        assert after == models_bytes(ref, after["round"]), step
        # Restart: resume from the store and finish -> bit-identical to the uninterrupted run.
        assert in_child(lambda: run_federation(store_dir)) == 0
        assert models_bytes(store_dir) == final, step


def test_l3_kill_at_random_times_resumes_with_identical_models(reference, tmp_path):
    ref, _ = reference
    final = models_bytes(ref)
    rng = random.Random(1234)  # seeded faults
    delays = []
    for trial in range(6):
        store_dir = tmp_path / f"random_{trial}"
        kills = 0
        while True:  # kill repeatedly until one run gets to the end
            pid = os.fork()
            if pid == 0:
                code = 0
                try:
                    run_federation(store_dir, step_delay=0.002)
                except BaseException:  # noqa: BLE001
                    code = 1
                os._exit(code)
            delay = rng.uniform(0.0, 0.25)
            time.sleep(delay)
            finished, status = os.waitpid(pid, os.WNOHANG)
            if finished == 0:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                kills += 1
                delays.append(round(delay, 3))
                snap = ModelStore(store_dir, keep=ROUNDS + 1).load_latest()
                if snap is not None:  # whatever is committed is a round of the reference, intact
                    assert models_bytes(store_dir) == models_bytes(ref, int(snap.round_idx))
                if kills < 3:
                    continue
                assert in_child(lambda: run_federation(store_dir)) == 0
            else:
                assert os.waitstatus_to_exitcode(status) == 0
            break
        assert models_bytes(store_dir) == final, (trial, kills)
    assert delays, "no run was killed mid-federation: the test did not exercise anything"
    print("random kill delays (s):", delays)


def test_p1_flipped_byte_detected_never_used(reference, tmp_path):
    ref, _ = reference
    store_dir = tmp_path / "flip"
    run_federation(store_dir)
    latest = store_dir / f"round_{ROUNDS - 1:08d}"
    target = latest / "cluster_0.npy"
    data = bytearray(target.read_bytes())
    data[-5] ^= 0x40
    target.write_bytes(bytes(data))
    after = models_bytes(store_dir)
    assert after["round"] == ROUNDS - 2  # the corrupt round is skipped, the previous one is used
    assert after == models_bytes(ref, ROUNDS - 2)


# --------------------------------------------------------------------- L4 robot killed mid-upload


def test_l4_robot_killed_mid_upload_never_aggregated_and_resyncs(tmp_path):
    from fed_ros.ros.wire.tensors import encode_state_dict
    from fed_ros.ros.wire.chunk_assembler import PayloadAssembler, TransferLimits
    from fed_ros.ros.wire.chunk_sender import ChunkedSender

    clock = [0.0]
    store = ModelStore(tmp_path / "store")
    coord = RoundCoordinator(
        make_strategy("fedavg"),
        store,
        RoundSettings(algorithm="fedavg", rounds=3, round_timeout_s=10.0, quorum_fraction=0.75),
        INITIAL,
        clock=lambda: clock[0],
    )
    signers = {rid: auth.Signer.generate() for rid in ROBOTS}
    for k, rid in enumerate(ROBOTS):
        assert coord.roster.register(
            rid, num_samples=10 + k, public_key=signers[rid].public_key
        ).accepted
    allow = auth.AllowList({rid: s.public_key for rid, s in signers.items()})
    guard = replay.ReplayGuard()
    assembler = PayloadAssembler(TransferLimits(), max_pending=8)
    manifest = manifest_of(INITIAL)
    plan = coord.start_round(now=0.0)
    guard.advance(plan.round_idx)

    def send(rid: str, k: int, round_idx: int, chunks_to_send: int | None = None):
        params = local_update(coord.strategy.model_for(rid), round_idx, k)
        encoded = encode_state_dict(params)
        env = UpdateEnvelope(
            robot_id=rid,
            round_idx=round_idx,
            base_round=round_idx,
            num_samples=10 + k,
            manifest=manifest,
            total_bytes=encoded.total_bytes,
            payload_sha256=encoded.sha256,
            nonce=signed_messages.new_nonce(),
        ).signed(signers[rid])
        sender = ChunkedSender(encoded, f"{rid}/r{round_idx}/update", chunk_bytes=1024)
        ctx = ValidationContext(
            current_round=round_idx,
            expected_manifest=manifest,
            base_rounds={round_idx},
            participants=set(coord.current_plan.participants),
            allow_list=allow,
            replay_guard=guard,
        )
        assert check_update_envelope(env, ctx)
        chunks = list(sender.chunks())
        assert len(chunks) > 4
        complete = None
        for chunk in chunks[:chunks_to_send]:
            complete = assembler.add(chunk)
        if complete is None:
            return None  # the robot died before its last chunk
        sd = complete.state_dict(copy=True)
        assert validate_update(env, sd, ctx, received_sha256=complete.sha256)
        upd = ClientUpdate(
            robot_id=rid, params=sd, num_samples=env.num_samples, base_round=env.base_round
        )
        upd.round_idx = round_idx
        assert coord.offer_update(upd, now=clock[0]).accepted
        return sd

    sent = {rid: send(rid, k, 0) for k, rid in enumerate(ROBOTS[:3])}
    assert send("robot_3", 3, 0, chunks_to_send=3) is None  # killed after 3 of its chunks
    assert assembler.pending_ids == ["robot_3/r0/update"]
    assert coord.poll(now=5.0) == (None, None)  # still waiting for robot_3 before the deadline
    clock[0] = 11.0
    next_plan, outcome = coord.poll(
        now=11.0
    )  # deadline: quorum 3 of 4 -> aggregate without robot_3
    assert outcome is not None and outcome.completed and outcome.updates_accepted == 3
    assert "robot_3" not in store.load_latest().meta["accepted"]
    # The committed model is exactly the weighted FedAvg of the three complete updates.
    weights = np.array([10, 11, 12], np.float64) / 33
    for name in INITIAL:
        expected = sum(w * sent[r][name].astype(np.float64) for w, r in zip(weights, ROBOTS[:3]))
        np.testing.assert_allclose(coord.cluster_models[0][name], expected, rtol=1e-5, atol=1e-6)
    assembler.discard("robot_3/r0/update")  # the round ended: its partial payload is dropped
    assert assembler.pending_bytes == 0
    # robot_3 restarts: registers again with the same key, downloads round 1's model and takes part.
    assert coord.roster.register(
        "robot_3", num_samples=13, public_key=signers["robot_3"].public_key
    ).accepted
    guard.advance(next_plan.round_idx)
    assert "robot_3" in next_plan.participants
    start = coord.strategy.model_for("robot_3")
    assert all(np.array_equal(start[n], coord.cluster_models[0][n]) for n in INITIAL)
    for k, rid in enumerate(ROBOTS):
        assert send(rid, k, next_plan.round_idx) is not None
    _, outcome = coord.poll(now=12.0)
    assert outcome.completed and outcome.updates_accepted == 4


# --------------------------------------------------------------------- real server process over DDS

E2E_ROUNDS = 5
TRAIN_SECONDS = 0.8  # the scripted robots "train" this long before answering a round
E2E_ROBOTS = ["robot_0", "robot_1", "robot_2"]


def _e2e_update(initial: dict, round_idx: int, k: int) -> dict:
    rng = np.random.default_rng([7, round_idx, k])
    return {n: (a + rng.normal(0, 0.01, a.shape)).astype(np.float32) for n, a in initial.items()}


class ScriptedRobots:
    """Three robots as one rclpy node in the test process: register, then answer every TRAIN
    announcement with a deterministic, signed, chunked ModelUpdate over /fleet/updates, and
    re-send an update the server has not acknowledged, as the robot node's outbox does: the
    server's updates inbox is KEEP_LAST, so under load a burst of nine chunks can push the
    first robot's signed first chunk out (seen in CI: robot_0's round-3 update never arrived)."""

    RESEND_AFTER_S = 4.0

    def __init__(self, signers: dict, initial: dict) -> None:
        import rclpy
        from rclpy.context import Context
        from rclpy.executors import SingleThreadedExecutor
        from fed_ros.msg import RoundAnnouncement, RoundReport, ModelUpdate, UpdateAck
        from fed_ros.ros.wire import qos
        from fed_ros.srv import Register

        self.ctx = Context()
        rclpy.init(context=self.ctx)
        self.node = rclpy.create_node("crash_test_robots", context=self.ctx)
        self.executor = SingleThreadedExecutor(context=self.ctx)
        self.executor.add_node(self.node)
        self.signers, self.initial = signers, initial
        self.announcement = None
        self.reports: dict[int, object] = {}
        self.answered: set[tuple] = set()
        self.pending = None  # (due time, announcement) of the round being "trained"
        self.outbox: dict[str, list] = {}  # payload id -> [next re-send time, chunk messages]
        self.resent = 0
        self.lost_once = False
        self.dead_server_endpoints: set[tuple] = set()
        self.Register = Register
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
            UpdateAck,
            "/fleet/update_acks",
            lambda m: self.outbox.pop(str(m.payload_id), None),
            qos.control_qos(),
        )
        self.client = self.node.create_client(Register, "/fleet/register")

    def spin(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.executor.spin_once(timeout_sec=0.05)
            if self.pending and time.monotonic() >= self.pending[0]:
                _, ann = self.pending
                self.pending = None
                self._answer(*ann)
            self._resend_due()

    def _resend_due(self) -> None:
        due = [pid for pid, (t, _) in self.outbox.items() if time.monotonic() >= t]
        if not due or not self._live_update_subscribers():
            return
        for pid in due:
            entry = self.outbox[pid]
            entry[0] = time.monotonic() + self.RESEND_AFTER_S
            self.resent += 1
            for msg in entry[1]:
                self.pub.publish(msg)

    def register_all(self, timeout: float = 60.0) -> None:
        assert self.client.wait_for_service(timeout_sec=timeout), (
            "server did not offer /fleet/register"
        )
        for k, rid in enumerate(E2E_ROBOTS):
            from fed_ros.ros.wire.register import register_request
            from fed_ros.ros.wire.service_calls import call_client_until_answered, spinning

            # Signed registration: the server runs with require_signatures (proof of key
            # possession). Asked again while unanswered (fed_ros.ros.wire.service_calls), signed
            # afresh per try.
            answer = call_client_until_answered(
                self.client,
                lambda: register_request(
                    rid,
                    action_dim=4,
                    num_samples=100 + 10 * k,
                    tasks=["lift"],
                    signer=self.signers[rid],
                ),
                spinning(lambda s: self.executor.spin_once(timeout_sec=s)),
                attempt_s=10.0,
                timeout_s=timeout,
            )
            assert answer.accepted, (rid, answer.reason)

    def _live_update_subscribers(self) -> list:
        return [
            info
            for info in self.node.get_subscriptions_info_by_topic("/fleet/updates")
            if tuple(info.endpoint_gid) not in self.dead_server_endpoints
        ]

    def server_killed(self) -> None:
        """Forget the killed server's /fleet/updates subscription: DDS keeps listing a SIGKILLed
        participant's endpoints until its lease expires, and a robot that publishes to it alone
        loses the update (the real robot node waits for a subscriber too)."""
        self.dead_server_endpoints |= {
            tuple(i.endpoint_gid)
            for i in self.node.get_subscriptions_info_by_topic("/fleet/updates")
        }

    def _wait_for_live_server(self, timeout: float = 30.0) -> None:
        from fed_ros.ros.wire.publish import wait_for_subscribers

        end = time.monotonic() + timeout
        while not self._live_update_subscribers():
            assert time.monotonic() < end, "no live server subscribes to /fleet/updates"
            self.executor.spin_once(timeout_sec=0.05)
        # then, as the robot node does, until our writer matched it
        wait_for_subscribers(self.node, self.pub, "/fleet/updates", timeout=timeout)

    def _on_round(self, msg) -> None:
        from fed_ros.ros.wire.round_msgs import STAGE_NAMES

        self.announcement = (
            int(msg.round),
            STAGE_NAMES.get(int(msg.stage)),
            list(msg.participants),
            (msg.header.stamp.sec, msg.header.stamp.nanosec),
        )
        if self.announcement[1] == "train":
            self.pending = (time.monotonic() + TRAIN_SECONDS, self.announcement)

    def _answer(self, round_idx: int, stage: str, participants: list, stamp: tuple) -> None:
        from fed_ros.ros.wire.round_msgs import model_update_msg
        from fed_ros.ros.wire.tensors import encode_state_dict
        from fed_ros.ros.wire.chunk_sender import ChunkedSender

        self._wait_for_live_server()
        for k, rid in enumerate(E2E_ROBOTS):
            if rid not in participants or (rid, round_idx, stamp) in self.answered:
                continue
            self.answered.add((rid, round_idx, stamp))
            encoded = encode_state_dict(_e2e_update(self.initial, round_idx, k))
            nonce = signed_messages.new_nonce()
            sender = ChunkedSender(
                encoded, f"{rid}/r{round_idx}/{nonce.hex()[:8]}", chunk_bytes=256 << 10
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
            msgs = [
                model_update_msg(
                    chunk,
                    robot_id=rid,
                    round_idx=round_idx,
                    base_round=round_idx,
                    num_samples=env.num_samples,
                    nonce=env.nonce,
                    signature=env.signature,
                )
                for chunk in sender.chunks()
            ]
            self.outbox[msgs[0].payload.payload_id] = [time.monotonic() + self.RESEND_AFTER_S, msgs]
            # The loss CI saw, on purpose: robot_0's first round-1 send loses its signed first
            # chunk.
            lost = 1 if (rid, round_idx) == ("robot_0", 1) and not self.lost_once else 0
            self.lost_once |= bool(lost)
            for msg in msgs[lost:]:
                self.pub.publish(msg)

    def close(self) -> None:
        self.node.destroy_node()
        self.ctx.try_shutdown()


@pytest.mark.ros
@pytest.mark.timeout(400)
def test_l3_real_server_node_killed_and_restarted_resumes_identically(tmp_path, ros_env, processes):
    """The real server node (DDS, signatures, chunked updates) is SIGKILLed mid-federation at a
    random time after round 0 and restarted; it resumes from the store and finishes with cluster
    models identical to the same federation computed without interruption."""
    import sys
    from fed_ros.learning.configuration_policy import PolicyConfig
    from fed_ros.learning.trainer import initial_state_dict

    assert keys_main(["generate", *E2E_ROBOTS, "--out", str(tmp_path / "keys")]) == 0
    signers = {rid: auth.Signer.from_file(tmp_path / "keys" / f"{rid}.key") for rid in E2E_ROBOTS}
    initial = initial_state_dict(PolicyConfig(kind="lowdim"), seed=0)
    state_dir = tmp_path / "server_state"
    argv = [
        sys.executable,
        "-m",
        "fed_ros.ros.nodes.server.server_node",
        "--ros-args",
        "-r",
        "__ns:=/fleet",
        "-p",
        "algorithm:=fedavg",
        "-p",
        f"rounds:={E2E_ROUNDS}",
        "-p",
        f"state_dir:={state_dir}",
        "-p",
        f"expected_robots:=[{','.join(E2E_ROBOTS)}]",
        "-p",
        "transfer_channel:=ros",
        "-p",
        "round_timeout_s:=120.0",
        "-p",
        "require_signatures:=true",
        "-p",
        f"allowed_keys_file:={tmp_path / 'keys' / 'allow_list.yaml'}",
        "-p",
        "seed:=0",
    ]
    server = processes.start(argv, ros_env, log_path=tmp_path / "server_1.log")
    robots = ScriptedRobots(signers, initial)
    rng = random.Random(99)
    try:
        robots.register_all()
        end = time.monotonic() + 150
        while 0 not in robots.reports and time.monotonic() < end:
            robots.spin(0.2)
            assert server.poll() is None, (tmp_path / "server_1.log").read_text()[-3000:]
        assert 0 in robots.reports, (
            f"round 0 never completed: {(tmp_path / 'server_1.log').read_text()[-3000:]}"
        )
        robots.spin(rng.uniform(0.1, 2.0))  # random kill time somewhere in rounds 1-3
        os.kill(server.pid, signal.SIGKILL)
        server.wait(timeout=10)
        robots.server_killed()
        committed = ModelStore(state_dir, keep=E2E_ROUNDS).committed_rounds()
        before = {r: models_bytes(state_dir, r) for r in committed}
        assert committed and committed[-1] < E2E_ROUNDS - 1, f"killed too late: {committed}"
        server = processes.start(argv, ros_env, log_path=tmp_path / "server_2.log")
        end = time.monotonic() + 200
        while (
            not (robots.announcement and robots.announcement[1] == "done")
            and time.monotonic() < end
        ):
            robots.spin(0.2)
            assert server.poll() is None, (tmp_path / "server_2.log").read_text()[-3000:]
        assert robots.announcement and robots.announcement[1] == "done", (
            f"no DONE after restart: {(tmp_path / 'server_2.log').read_text()[-3000:]}"
        )
    finally:
        robots.close()
    assert robots.lost_once and robots.resent >= 1, "the lost first chunk was never re-sent"
    log2 = (tmp_path / "server_2.log").read_text()
    assert "resumed after committed round" in log2
    # Rounds committed before the kill are untouched; the federation completed all rounds.
    still_kept = set(
        ModelStore(state_dir, keep=E2E_ROUNDS).committed_rounds()
    )  # the server keeps 3
    assert still_kept
    for r, snap in before.items():
        if r in still_kept:
            assert models_bytes(state_dir, r) == snap
    final = models_bytes(state_dir)
    assert final["round"] == E2E_ROUNDS - 1
    # Reference: the same updates through the same strategy, without any interruption.
    strategy = make_strategy("fedavg")
    strategy.initialize(initial, E2E_ROBOTS)
    for r in range(E2E_ROUNDS):
        strategy.configure_round(r, E2E_ROBOTS)
        ups = [
            ClientUpdate(
                robot_id=rid,
                params=_e2e_update(initial, r, k),
                num_samples=100 + 10 * k,
                base_round=r,
            )
            for k, rid in enumerate(E2E_ROBOTS)
        ]
        result = strategy.aggregate_round(r, ups, {})
    expected = {c: {n: a.tobytes() for n, a in m.items()} for c, m in result.cluster_models.items()}
    assert final["models"] == expected
    # Every accepted update is in the audit log with its reason; none was rejected.
    entries = read_audit_log(state_dir / "audit.jsonl")
    accepted = [e for e in entries if e["kind"] == "update" and e["accepted"]]
    assert {(e["robot_id"], e["round"]) for e in accepted} >= {
        (rid, r) for rid in E2E_ROBOTS for r in range(E2E_ROUNDS)
    }
