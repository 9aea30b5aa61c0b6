"""Transfer objects and delivery bookkeeping without ROS processes: the retry schedule, the
outbox (re-send until acknowledged), the ledger (idempotent receipt), the channel choice, and
the receiver's one payload check. Messages are built in-process; bulk fetches use a real
BulkServer thread over loopback TCP."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import zmq

from fed_ros.core.checks.decisions import Decision, NON_FINITE, OUT_OF_RANGE, SCHEMA, UNREACHABLE
from fed_ros.core.rounds.delivery import Ledger, Outbox, RetrySchedule
from fed_ros.core.params import manifest_of
from fed_ros.ros.wire import bulk
from fed_ros.ros.wire.bulk_fetch import BulkFetch
from fed_ros.ros.wire.channels import choose_channel
from fed_ros.ros.wire.transfer import TransferSender
from fed_ros.ros.wire.transfer_receiver import TransferReceiver

MODEL = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(3, np.float32)}


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


# ------------------------------------------------------------------ delivery (pure)


def test_retry_schedule_doubles_up_to_its_cap_and_validates() -> None:
    s = RetrySchedule(first_s=1.0, factor=2.0, max_s=5.0)
    assert [s.delay(k) for k in range(1, 6)] == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert RetrySchedule(first_s=2.0, factor=2.0, max_s=10.0).delay(10_000) == 10.0
    for bad in (dict(first_s=0.0), dict(factor=0.5), dict(first_s=3.0, max_s=2.0)):
        with pytest.raises(ValueError, match="RetrySchedule"):
            RetrySchedule(**bad)
    with pytest.raises(ValueError, match="attempt"):
        s.delay(0)


def test_retry_jitter_spreads_each_delay_within_its_band() -> None:
    s = RetrySchedule(first_s=2.0, factor=2.0, max_s=10.0, jitter=0.5)
    assert s.delay(1) == 2.0  # the band's middle is the schedule itself
    assert (s.delay(1, draw=0.0), s.delay(1, draw=1.0)) == (1.0, 3.0)
    assert (s.delay(9, draw=0.0), s.delay(9, draw=1.0)) == (5.0, 15.0)  # around the cap too
    assert RetrySchedule(first_s=2.0).delay(2, draw=0.0) == 4.0  # no jitter: draw ignored
    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError, match="jitter must be in"):
            RetrySchedule(jitter=bad)
    with pytest.raises(ValueError, match="draw"):
        s.delay(1, draw=1.5)


def test_outboxes_dropped_together_resend_spread_out() -> None:
    """100 robots whose updates one full inbox dropped at t = 0: with the deterministic schedule
    all re-send at t = 2 s; with the robot's jitter they spread over [1, 3) s."""
    import random

    def first_resends(jitter: float) -> list[float]:
        times = []
        for robot in range(100):
            clock = FakeClock()
            box = Outbox(
                RetrySchedule(first_s=2.0, jitter=jitter),
                clock=clock,
                draw=random.Random(robot).random,
            )
            box.add(0, f"robot_{robot}/r0", item="p", deadline=60.0)
            clock.now = next(t / 100 for t in range(400) if box.due(now=t / 100))
            times.append(clock.now)
        return times

    assert set(first_resends(0.0)) == {2.0}
    spread = first_resends(0.5)
    assert 1.0 <= min(spread) < 1.2 and 2.8 < max(spread) <= 3.0
    assert len(set(spread)) > 50  # not in a few waves either


def test_outbox_resends_on_schedule_until_acknowledged_or_deadline() -> None:
    clock = FakeClock()
    box = Outbox(RetrySchedule(first_s=1.0, factor=2.0, max_s=4.0), clock=clock)
    box.add(3, "r0/r3/a", item="payload", deadline=20.0)
    assert box.due() == []  # sent just now
    clock.now = 1.0
    assert [e.payload_id for e in box.due()] == ["r0/r3/a"]  # send 2
    clock.now = 2.5
    assert box.due() == []  # next after 2 s more
    clock.now = 3.0
    assert [e.sends for e in box.due()] == [3]
    assert box.acknowledge("r0/r3/a", Decision(True)) is not None
    assert box.acknowledge("r0/r3/a", Decision(True)) is None  # a repeated ack is not news
    clock.now = 100.0
    assert box.due() == []
    box.add(4, "r0/r4/b", item="p4", deadline=5.0)
    clock.now = 200.0
    assert box.due() == []  # the round's deadline passed: no more re-sends
    assert box.for_round(4).item == "p4"  # still cached for a re-announcement
    reopened = box.reopen(4, "r0/r4/c", item="p4", deadline=300.0)
    assert reopened.payload_id == "r0/r4/c" and reopened.decision is None
    box.forget_before(4)
    assert box.for_round(3) is None and box.for_round(4) is not None


def test_outbox_expedite_after_an_outage_resends_now_and_restarts_the_backoff() -> None:
    clock = FakeClock()
    box = Outbox(RetrySchedule(first_s=1.0, factor=2.0, max_s=8.0), clock=clock)
    box.add(0, "r1/r0/a", item="p", deadline=100.0)
    box.add(1, "r1/r1/b", item="q", deadline=100.0)
    box.acknowledge("r1/r1/b", Decision(True))
    for t in (1.0, 3.0, 7.0, 15.0):  # sends 2..5 during an outage: the delay grew to its cap
        clock.now = t
        assert len(box.due()) == 1
    clock.now = 16.0  # the link is back and the receiver re-matched 7 s before the next re-send
    assert box.due() == []
    assert [e.payload_id for e in box.expedite()] == ["r1/r0/a"]  # acknowledged entries stay quiet
    assert [e.payload_id for e in box.due()] == ["r1/r0/a"]  # at once
    clock.now = 17.0
    assert len(box.due()) == 1  # then first_s later (its acknowledgement may have been lost too)
    box.add(2, "r1/r2/c", item="r", deadline=100.0)  # sent to the re-matched receiver
    assert [e.payload_id for e in box.expedite(added_before=16.5)] == ["r1/r0/a"]
    clock.now = 101.0
    assert box.expedite() == [] and box.due() == []  # past the round's deadline: nothing


def test_ledger_answers_resends_and_reopens_an_abandoned_round() -> None:
    ledger = Ledger(max_ids=3)
    assert ledger.decided("p") is None
    ledger.decide("p", 0, Decision(True))
    ledger.decide("q", 0, Decision(False, NON_FINITE, "NaN"))
    ledger.decide("x", 1, Decision(True))
    assert ledger.decided("p").accepted and ledger.decided("q").code == NON_FINITE
    ledger.reopen(0)  # round 0 announced again: its payloads are collected afresh
    assert ledger.decided("p") is None and ledger.decided("q") is None and ledger.decided("x")
    for pid in "abcd":
        ledger.decide(pid, 2, Decision(True))
    assert len(ledger) == 3 and ledger.decided("a") is None  # bounded
    with pytest.raises(ValueError, match="max_ids"):
        Ledger(max_ids=0)


def test_channel_choice_follows_setting_and_threshold() -> None:
    assert (
        choose_channel("auto", 999, 1000) == "ros" and choose_channel("auto", 1000, 1000) == "zmq"
    )
    assert choose_channel("ros", 10 << 20) == "ros" and choose_channel("zmq", 1) == "zmq"
    with pytest.raises(ValueError, match="'udp'"):
        choose_channel("udp", 1)


# ------------------------------------------------------------------ sender / receiver


def test_sender_and_receiver_over_ros_chunks_with_resend() -> None:
    sender = TransferSender("ros", chunk_bytes=16)
    out = sender.prepare(MODEL, "robot_0/r1/u", cluster_id=2)
    chunks = out.chunks()
    assert (
        out.channel == "ros"
        and out.bulk_uri == ""
        and len(chunks) == 3
        and out.meta == {"cluster_id": 2}
    )
    clock = FakeClock()
    receiver = TransferReceiver(manifest_of(MODEL), stall_timeout_s=1.0, clock=clock)
    try:
        assert receiver.offer(chunks[0], tag="env") is None and receiver.busy("robot_0/r1/u")
        clock.now = 2.0
        (request,) = receiver.resend_requests()
        resent_out, resent = sender.resend(request)
        assert resent_out is out and [c.chunk_index for c in resent] == [1, 2]
        assert receiver.offer(resent[0]) is None
        result = receiver.offer(resent[1])
        assert result.decision and result.tag == "env" and result.nbytes == 36
        assert all(np.array_equal(result.params[k], MODEL[k]) for k in MODEL)
        assert (
            not receiver.busy("robot_0/r1/u") and receiver.offer(chunks[0]) is None
        )  # late chunk ignored
    finally:
        receiver.close()
        sender.close()


@pytest.mark.parametrize(
    "change, code",
    [
        (lambda m: {"w": m["w"], "b": m["b"], "evil": np.zeros(1, np.float32)}, SCHEMA),
        (lambda m: {"w": m["w"].reshape(3, 2), "b": m["b"]}, SCHEMA),
        (lambda m: {"w": np.full((2, 3), np.nan, np.float32), "b": m["b"]}, NON_FINITE),
        (lambda m: {"w": np.full((2, 3), -1e30, np.float32), "b": m["b"]}, OUT_OF_RANGE),
    ],
)
def test_receiver_is_the_one_payload_check_with_a_code(change, code) -> None:
    """Manifest before any byte (schema), values after decoding (finite, range): one Decision
    each."""
    out = TransferSender("ros").prepare(change(MODEL), "p")
    receiver = TransferReceiver(manifest_of(MODEL))
    try:
        result = receiver.offer(out.chunks()[0], tag="t")
        assert result is not None and not result.decision and result.decision.code == code, result
        assert result.tag == "t" and result.params is None and not receiver.busy("p")
    finally:
        receiver.close()


def test_bulk_channel_auto_threshold_secret_and_retry_resumes() -> None:
    """auto -> bulk above the threshold; the uri carries a per-transfer secret the server checks;
    an unreachable sender is retried with backoff and the error names its endpoint."""
    sender = TransferSender("auto", bulk_threshold_bytes=10)
    receiver = TransferReceiver(
        manifest_of(MODEL),
        fetch_retry=RetrySchedule(first_s=0.1, factor=1.0, max_s=0.1),
        fetch_idle_timeout_s=0.2,
    )
    try:
        out = sender.prepare(MODEL, "r/1")
        control = out.chunks()[0]
        assert out.channel == "zmq" and len(control.data) == 0
        secret = control.bulk_uri.rsplit("/", 1)[1]
        assert len(secret) == 32 and int(secret, 16) >= 0  # 128 random bits
        forged = sender.prepare(MODEL, "r/2").chunks()[
            0
        ]  # a bulk control message, wrong secret below
        forged.bulk_uri = control.bulk_uri.rsplit("/", 1)[0] + "/" + "0" * 32
        assert receiver.offer(forged) is None and receiver.offer(control, tag="ok") is None
        results = _wait_completed(receiver, 2)
        by_id = {r.payload_id: r for r in results}
        assert not by_id["r/2"].decision and "unknown token" in by_id["r/2"].decision.reason
        assert by_id["r/1"].decision and by_id["r/1"].tag == "ok"
        assert sender.bulk_server("zmq").refused == 1  # the secret was checked before serving
        # The sender goes away: the fetch is retried within its budget, then rejected naming the
        # endpoint.
        gone = sender.prepare(MODEL, "r/3").chunks()[0]
        sender.close()
        assert receiver.offer(gone, retry_for_s=0.5) is None
        (result,) = _wait_completed(receiver, 1)
        endpoint = gone.bulk_uri.rsplit("/", 1)[0]
        assert (
            result.decision.code == UNREACHABLE
            and f"bulk server {endpoint} unreachable" in result.decision.reason
        )
    finally:
        receiver.close()
        sender.close()


def _wait_completed(receiver: TransferReceiver, n: int, timeout: float = 30.0) -> list:
    import time

    out: list = []
    deadline = time.monotonic() + timeout
    while len(out) < n:
        assert time.monotonic() < deadline, f"only {len(out)} of {n} fetches completed"
        out += receiver.completed()
        time.sleep(0.02)
    return out


def test_bulk_fetches_wait_while_max_fetched_decoded_payloads_are_not_taken() -> None:
    """A node that admits slower than the fetch workers pull holds max_fetched decoded
    models, not every robot's; the rest are fetched as completed() takes results."""
    import time

    sender = TransferSender("zmq", keep=64)
    receiver = TransferReceiver(manifest_of(MODEL), max_pending=64, fetch_workers=2, max_fetched=3)
    try:
        for k in range(10):
            control = sender.prepare(MODEL, f"r{k}/1").chunks()[0]
            assert receiver.offer(control, tag=k) is None
        time.sleep(1.0)  # ample for ten 36-byte fetches over loopback
        assert receiver._done.qsize() == 3  # the bound, not 10
        assert len(receiver._fetching) == 7  # the rest wait, offered but not pulled
        taken = receiver.completed()
        assert len(taken) == 3
        taken += _wait_completed(receiver, 7)
        assert sorted(r.tag for r in taken) == list(range(10))
        assert all(r.decision for r in taken)
    finally:
        receiver.close()
        sender.close()


def test_max_fetched_below_the_workers_is_refused() -> None:
    with pytest.raises(ValueError, match="max_fetched=1 < fetch_workers=2"):
        TransferReceiver(manifest_of(MODEL), fetch_workers=2, max_fetched=1)


def test_bulk_fetch_follows_a_restarted_sender_offering_the_same_bytes_elsewhere() -> None:
    """A server killed while a robot fetched its model from it republishes the same model (same
    payload id and sha256) from a new bulk endpoint; the fetch goes there instead of retrying
    the dead one until its budget runs out (a clean-clone run: robot_0 retried the killed
    server's port for 60 s, rejected the model as unreachable, and the round was abandoned)."""
    first = TransferSender("zmq")
    second = TransferSender("zmq")
    receiver = TransferReceiver(
        manifest_of(MODEL),
        fetch_retry=RetrySchedule(first_s=8.0, factor=1.0, max_s=8.0),
        fetch_idle_timeout_s=0.2,
    )
    try:
        dead = first.prepare(MODEL, "cluster_0/r1/abc").chunks()[0]
        first.close()  # killed before the robot fetched
        assert receiver.offer(dead, tag="model", retry_for_s=600.0) is None
        again = second.prepare(MODEL, "cluster_0/r1/abc").chunks()[0]
        assert again.bulk_uri != dead.bulk_uri and again.sha256 == dead.sha256
        assert receiver.offer(again) is None  # the restarted server's latched republication
        # Well before the 8 s retry delay and the 600 s budget: fetched from the new endpoint.
        (result,) = _wait_completed(receiver, 1, timeout=6.0)
        assert result.decision and result.tag == "model"
        np.testing.assert_array_equal(result.params["w"], MODEL["w"])
        # Another payload under the same id (other bytes) does not redirect a fetch.
        third = TransferSender("zmq")
        try:
            other = third.prepare(
                {k: v + 1 for k, v in MODEL.items()}, "cluster_0/r2/abc"
            ).chunks()[0]
            gone = second.prepare(MODEL, "cluster_0/r2/abc").chunks()[0]
            second.close()
            assert receiver.offer(gone, retry_for_s=1.0) is None and receiver.offer(other) is None
            (result,) = _wait_completed(receiver, 1, timeout=20.0)
            assert result.decision.code == UNREACHABLE
        finally:
            third.close()
    finally:
        receiver.close()
        first.close()
        second.close()


def test_bulk_fetch_resumes_after_an_outage_with_the_chunks_it_had() -> None:
    ctx = zmq.Context()
    server = bulk.BulkServer(context=ctx)
    try:
        data = np.random.default_rng(0).integers(0, 255, 100_000, dtype=np.uint8)
        uri = server.offer(data)
        fetch = BulkFetch(uri, data.nbytes, hashlib.sha256(data).hexdigest(), chunk_bytes=10_000)
        fetch.received.update({0, 1, 2})  # as if three chunks arrived before the link went down
        fetch.buf[:30_000] = data[:30_000]
        fetch._hasher.update(data[:30_000])  # noqa: SLF001
        fetch._hashed_upto = 3  # noqa: SLF001
        requested = []
        orig = server._send_chunk  # noqa: SLF001
        server._send_chunk = lambda ident, token, d, i, r: (
            requested.append(i),
            orig(ident, token, d, i, r),
        )
        assert fetch.run(context=ctx).tobytes() == data.tobytes()
        assert sorted(requested) == list(range(3, 10))  # only what was missing
    finally:
        server.close()
        ctx.term()


def test_bulk_bind_follows_the_advertised_host() -> None:
    assert bulk.bulk_bind_endpoint(env={}) == "tcp://127.0.0.1:*"
    assert bulk.bulk_bind_endpoint(env={"FED_ROS_BULK_HOST": "127.0.0.1"}) == "tcp://127.0.0.1:*"
    # An advertised name that is not an address of this machine (NAT, DNS): every interface.
    assert bulk.bulk_bind_endpoint(env={"FED_ROS_BULK_HOST": "192.0.2.77"}) == "tcp://0.0.0.0:*"
    assert (
        bulk.bulk_bind_endpoint(
            env={"FED_ROS_BULK_HOST": "x", "FED_ROS_BULK_BIND": "tcp://0.0.0.0:5555"}
        )
        == "tcp://0.0.0.0:5555"
    )
    assert (
        bulk.bulk_bind_endpoint("tcp://127.0.0.1:7000", env={"FED_ROS_BULK_HOST": "x"})
        == "tcp://127.0.0.1:7000"
    )


# ------------------------------------------------------------------ the channel seam


class _MemoryChannel:
    """An in-process bulk channel: what a third channel (HTTP, Zenoh, ...) has to provide."""

    store: dict[str, bytes] = {}

    class Server:
        def __init__(self, ttl_s: float) -> None:
            self.ttl_s, self.offered = ttl_s, 0

        def offer(self, data) -> str:
            self.offered += 1
            uri = f"mem://{self.offered}"
            _MemoryChannel.store[uri] = bytes(memoryview(data).cast("B"))
            return uri

        def withdraw(self, uri: str) -> None:
            _MemoryChannel.store.pop(uri, None)

        def close(self) -> None:
            pass

    class Fetch:
        def __init__(self, payload, limits) -> None:
            self.payload, self.received, self.ranges = payload, [], [0]

        def run(self, *, idle_timeout_s: float, max_retries: int):
            data = _MemoryChannel.store[self.payload.bulk_uri]
            assert (
                hashlib.sha256(data).hexdigest() == self.payload.sha256
            )  # verified, as the contract says
            return np.frombuffer(data, np.uint8)


def test_a_third_channel_is_one_registry_entry(monkeypatch) -> None:
    from fed_ros.ros.wire import channels

    mem = channels.BulkChannel("mem", "mem://", _MemoryChannel.Server, _MemoryChannel.Fetch)
    monkeypatch.setitem(channels.BULK_CHANNELS, "mem", mem)
    assert choose_channel("mem", 1) == "mem" and channels.bulk_channel_for("mem://7") is mem
    with pytest.raises(ValueError, match="no bulk channel serves 'udp://x'"):
        channels.bulk_channel_for("udp://x")
    sender = TransferSender("mem")
    out = sender.prepare(MODEL, "robot_0/r1/u")
    assert (
        out.channel == "mem"
        and out.bulk_uri == "mem://1"
        and sender.bulk_server("mem").offered == 1
    )
    receiver = TransferReceiver(manifest_of(MODEL))
    try:
        (control,) = out.chunks()
        assert receiver.offer(control, tag="t") is None  # fetched on a worker thread
        (result,) = _wait_completed(receiver, 1)
        assert result.decision and result.tag == "t"
        assert all(np.array_equal(result.params[k], MODEL[k]) for k in MODEL)
    finally:
        receiver.close()
        sender.close()
