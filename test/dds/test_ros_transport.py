"""Chunked transfer (assembler caps, sha256, resume) and the zmq bulk channel.

The assembler tests are pure (messages built in-process, a fake clock); the bulk tests
run a real BulkServer thread and fetch over loopback TCP. The cross-process paths over
Fast DDS are in test_interfaces_roundtrip.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import zmq

from fed_ros.msg import TensorPayload
from fed_ros.ros.wire.tensors import (
    EncodedPayload,
    decode_state_dict,
    encode_state_dict,
    manifest_from_msgs,
    set_bytes_field,
    sha256_hex,
)
from fed_ros.ros.wire import bulk
from fed_ros.ros.wire.bulk_fetch import BulkUnreachable, fetch_bulk
from fed_ros.ros.wire.chunk_assembler import (
    ChunkDropped,
    CompletePayload,
    PayloadAssembler,
    PayloadRejected,
    TransferLimits,
)
from fed_ros.ros.wire.chunk_assembler import decode_resend_request, encode_resend_request
from fed_ros.ros.wire.chunk_sender import ChunkedSender
from fed_ros.ros.wire.fastdds_profile import apply_fastdds_profile, fastdds_profile_path


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _encoded(n_floats: int = 10_000, seed: int = 0) -> EncodedPayload:
    rng = np.random.default_rng(seed)
    return encode_state_dict(
        {
            "a": rng.standard_normal(n_floats // 2, dtype=np.float32),
            "b": rng.standard_normal((n_floats - n_floats // 2, 1), dtype=np.float32),
        }
    )


def _assert_same(done: CompletePayload, enc: EncodedPayload) -> None:
    assert done.sha256 == enc.sha256
    assert done.data.tobytes() == enc.data.tobytes()
    sd = done.state_dict()
    assert list(sd) == ["a", "b"] and sd["b"].shape == (5000, 1)


# ---------------------------------------------------------------------- assembler


def test_out_of_order_chunks_complete_once() -> None:
    enc = _encoded()
    sender = ChunkedSender(enc, "robot_1/r1/update", chunk_bytes=4096)
    assert sender.chunk_count == 10
    asm = PayloadAssembler()
    chunks = list(sender.chunks())
    order = [3, 0, 9, 1, 2, 8, 4, 7, 5]
    for i in order:
        assert asm.add(chunks[i]) is None
    assert asm.missing("robot_1/r1/update") == [6]
    done = asm.add(chunks[6])
    _assert_same(done, enc)
    assert asm.pending_ids == [] and asm.pending_bytes == 0
    assert asm.add(chunks[6]) is None  # late duplicate of a finished payload is ignored


def test_duplicate_chunk_is_ignored() -> None:
    enc = _encoded()
    sender = ChunkedSender(enc, "p", chunk_bytes=8192)
    asm = PayloadAssembler()
    first = sender.chunk(0)
    assert asm.add(first) is None and asm.add(sender.chunk(0)) is None
    assert asm.missing("p") == list(range(1, sender.chunk_count))


def test_oversize_payload_rejected_before_any_allocation() -> None:
    enc = _encoded(100_000)  # 400 kB
    asm = PayloadAssembler(TransferLimits(max_total_bytes=100_000))
    with pytest.raises(PayloadRejected, match="total_bytes 400000 exceeds cap 100000"):
        asm.add(ChunkedSender(enc, "big", chunk_bytes=1000).chunk(0))
    assert asm.pending_bytes == 0 and asm.pending_ids == []
    # the next valid payload is still accepted
    small = _encoded(1000)
    sender = ChunkedSender(small, "small", chunk_bytes=1 << 20)
    done = asm.add(sender.chunk(0))
    assert done is not None and done.sha256 == small.sha256


def test_lying_header_rejected() -> None:
    enc = _encoded()
    asm = PayloadAssembler(TransferLimits(max_chunk_bytes=1024))
    with pytest.raises(PayloadRejected, match="cap 1024"):
        asm.add(ChunkedSender(enc, "p", chunk_bytes=4096).chunk(0))
    chunk = ChunkedSender(enc, "q", chunk_bytes=1024).chunk(0)
    chunk.total_bytes = enc.total_bytes + 4  # manifest says otherwise
    with pytest.raises(PayloadRejected, match="manifest implies 40000 bytes"):
        asm.add(chunk)
    chunk = ChunkedSender(enc, "r", chunk_bytes=1024).chunk(0)
    chunk.chunk_index = chunk.chunk_count
    with pytest.raises(PayloadRejected, match="chunk_index 40 >= chunk_count 40"):
        asm.add(chunk)
    chunk = ChunkedSender(enc, "s", chunk_bytes=1024).chunk(1)
    chunk.chunk_offset = enc.total_bytes - 10
    with pytest.raises(PayloadRejected, match="beyond total_bytes"):
        asm.add(chunk)
    chunk = ChunkedSender(enc, "t", chunk_bytes=1024).chunk(0)
    chunk.sha256 = "XYZ"
    with pytest.raises(PayloadRejected, match="sha256 must be 64"):
        asm.add(chunk)
    assert asm.pending_bytes == 0


def test_mixed_payload_headers_rejected() -> None:
    a, b = _encoded(seed=1), _encoded(seed=2)
    asm = PayloadAssembler()
    asm.add(ChunkedSender(a, "same-id", chunk_bytes=4096).chunk(0))
    with pytest.raises(PayloadRejected, match="disagrees with the first chunk"):
        asm.add(ChunkedSender(b, "same-id", chunk_bytes=4096).chunk(1))


def test_overlapping_chunk_rejected() -> None:
    enc = _encoded()
    asm = PayloadAssembler()
    sender = ChunkedSender(enc, "p", chunk_bytes=4096)
    asm.add(sender.chunk(0))
    bad = sender.chunk(1)
    bad.chunk_offset = 100
    with pytest.raises(PayloadRejected, match="overlaps chunk 0"):
        asm.add(bad)


def test_corrupted_chunk_is_dropped_and_its_resend_completes_the_payload() -> None:
    # Every chunk's sha256 is listed in the (signed) first chunk: a corrupted chunk is dropped
    # on arrival without losing the upload, and the intact chunk re-sent completes it.
    enc = _encoded()
    sender = ChunkedSender(enc, "p", chunk_bytes=8192)
    asm = PayloadAssembler()
    chunks = list(sender.chunks())
    intact = bytes(chunks[2].data)
    corrupted = bytearray(intact)
    corrupted[17] ^= 0xFF
    set_bytes_field(chunks[2], "data", bytes(corrupted))
    for c in chunks[:2]:
        assert asm.add(c) is None
    with pytest.raises(ChunkDropped, match="does not hash to its listed sha256"):
        asm.add(chunks[2])
    for c in chunks[3:]:
        assert asm.add(c) is None
    assert asm.pending_ids == ["p"]  # the honest upload is kept, waiting for chunk 2
    set_bytes_field(chunks[2], "data", intact)
    done = asm.add(chunks[2])
    assert done is not None and done.sha256 == enc.sha256
    assert asm.pending_ids == []


def test_stalled_payload_reports_missing_and_resend_completes_it() -> None:
    clock = FakeClock()
    enc = _encoded()
    sender = ChunkedSender(enc, "robot_2/r5/update", chunk_bytes=4096)
    asm = PayloadAssembler(stall_timeout_s=1.0, clock=clock)
    lost = {2, 7}
    for c in sender.chunks():
        if c.chunk_index not in lost:
            asm.add(c)
    assert asm.stalled() == {}  # not yet timed out
    clock.now = 1.5
    requests = asm.stalled()
    assert requests == {"robot_2/r5/update": [2, 7]}
    # the request travels as JSON in a std_msgs/String; the sender resends only those
    pid, indices = decode_resend_request(encode_resend_request(*next(iter(requests.items()))))
    resent = sender.resend(indices)
    assert [c.chunk_index for c in resent] == [2, 7]
    assert asm.add(resent[0]) is None
    _assert_same(asm.add(resent[1]), enc)


def test_resume_requests_stop_after_max_but_a_full_resend_resumes_the_partial() -> None:
    """A link outage longer than the resume budget: the receiver stops asking but keeps its
    chunks; the sender's re-send (no acknowledgement) completes the payload with what was
    missing."""
    clock = FakeClock()
    enc = _encoded()
    sender = ChunkedSender(enc, "p", chunk_bytes=4096)
    asm = PayloadAssembler(stall_timeout_s=1.0, max_resume_requests=2, clock=clock)
    asm.add(sender.chunk(0))
    for step in range(1, 3):
        clock.now = step * 1.1
        assert "p" in asm.stalled()
    clock.now = 10.0
    assert asm.stalled() == {} and asm.pending_ids == ["p"]
    done = None
    for chunk in sender.chunks():
        done = asm.add(chunk) or done
    _assert_same(done, enc)
    asm.discard("p")
    assert asm.pending_bytes == 0


def test_max_pending_bounds_memory() -> None:
    clock = FakeClock()
    asm = PayloadAssembler(max_pending=2, stall_timeout_s=1.0, max_resume_requests=1, clock=clock)
    for pid in ("a", "b"):
        asm.add(ChunkedSender(_encoded(), pid, chunk_bytes=4096).chunk(0))
    with pytest.raises(PayloadRejected, match="max_pending=2"):
        asm.add(ChunkedSender(_encoded(), "c", chunk_bytes=4096).chunk(0))
    clock.now = 5.0  # "a" abandoned long ago: it makes room
    asm.add(ChunkedSender(_encoded(), "c", chunk_bytes=4096).chunk(0))
    assert asm.pending_ids == ["b", "c"]


def test_resend_rejects_bad_indices_and_requests_validate() -> None:
    sender = ChunkedSender(_encoded(), "p", chunk_bytes=4096)
    with pytest.raises(ValueError, match=r"\[10\]"):
        sender.resend([1, 10])
    for bad in (
        "not json",
        json.dumps({"payload_id": "p"}),
        json.dumps({"payload_id": "", "chunks": []}),
        json.dumps({"payload_id": "p", "chunks": [-1]}),
    ):
        with pytest.raises(ValueError, match="malformed resend request"):
            decode_resend_request(bad)


def test_bulk_control_message_is_not_assembled() -> None:
    enc = _encoded()
    msg = ChunkedSender(enc, "p", bulk_uri="tcp://127.0.0.1:1/abc").chunk(0)
    with pytest.raises(PayloadRejected, match="use fetch_bulk"):
        PayloadAssembler().add(msg)


# --------------------------------------------------------------------- bulk channel


@pytest.fixture
def bulk_server():
    ctx = zmq.Context()
    server = bulk.BulkServer(context=ctx)
    try:
        yield server, ctx
    finally:
        server.close()
        ctx.term()


def test_bulk_fetch_round_trip(bulk_server) -> None:
    server, ctx = bulk_server
    enc = _encoded(300_000)  # 1.2 MB, several 256 kB chunks
    uri = server.offer(enc.data)
    control = ChunkedSender(enc, "robot_1/r2/update", bulk_uri=uri).chunk(0)
    assert len(control.data) == 0 and control.bulk_uri == uri
    data = fetch_bulk(control, chunk_bytes=256 << 10, window=2, context=ctx)
    assert data.tobytes() == enc.data.tobytes()
    sd = decode_state_dict(manifest_from_msgs(control.manifest), control.encoding, data)
    np.testing.assert_array_equal(
        sd["a"], decode_state_dict(enc.manifest, enc.encoding, enc.data)["a"]
    )


def test_bulk_size_cap_checked_before_connecting() -> None:
    enc = _encoded(100_000)
    # nothing listens on this endpoint: a fetch that connected would time out instead
    control = ChunkedSender(enc, "p", bulk_uri="tcp://127.0.0.1:9/deadbeef").chunk(0)
    with pytest.raises(PayloadRejected, match="exceeds cap 1000"):
        fetch_bulk(control, limits=TransferLimits(max_total_bytes=1000))


def test_bulk_unknown_token_and_wrong_digest(bulk_server) -> None:
    server, ctx = bulk_server
    enc = _encoded()
    uri = server.offer(enc.data)
    with pytest.raises(PayloadRejected, match="unknown token"):
        fetch_bulk(uri.rsplit("/", 1)[0] + "/" + "0" * 32, enc.total_bytes, enc.sha256, context=ctx)
    with pytest.raises(PayloadRejected, match="sha256 mismatch"):
        fetch_bulk(uri, enc.total_bytes, "0" * 64, context=ctx)
    server.withdraw(uri)
    with pytest.raises(PayloadRejected, match="unknown token"):
        fetch_bulk(uri, enc.total_bytes, enc.sha256, context=ctx)


class _LossyBulkServer(bulk.BulkServer):
    """Drops the first transmission of some chunks (a lost frame / restarted peer)."""

    def __init__(self, drop: set[int], **kw) -> None:
        self.drop = set(drop)
        self.sent: list[int] = []
        super().__init__(**kw)

    def _send_chunk(self, ident, token, data, index, ranges) -> None:
        self.sent.append(index)
        if index in self.drop:
            self.drop.discard(index)
            return
        super()._send_chunk(ident, token, data, index, ranges)


def test_bulk_fetch_resumes_only_missing_chunks() -> None:
    ctx = zmq.Context()
    server = _LossyBulkServer({1, 3}, context=ctx)
    try:
        enc = _encoded(20_000)  # 80 kB in 16 kB chunks = 5 chunks
        uri = server.offer(enc.data)
        data = fetch_bulk(
            uri,
            enc.total_bytes,
            enc.sha256,
            chunk_bytes=16_000,
            window=8,
            idle_timeout_s=0.3,
            context=ctx,
        )
        assert data.tobytes() == enc.data.tobytes()
        assert server.sent == [0, 1, 2, 3, 4, 1, 3]  # second request: only the lost ones
    finally:
        server.close()
        ctx.term()


class _HostileBulkServer(bulk.BulkServer):
    """Answers chunk 0 a second time with other bytes, or sends a chunk one byte too long."""

    def __init__(self, mode: str, **kw) -> None:
        self.mode = mode
        super().__init__(**kw)

    def _send_chunk(self, ident, token, data, index, ranges) -> None:
        off, n = ranges[index]
        if self.mode == "too_long" and index == 1:
            self._sock.send_multipart(
                [
                    ident,
                    token,
                    bulk.DATA_FRAME,
                    bulk.CHUNK_HEADER.pack(index, len(ranges), off),
                    data[off : off + n + 1],
                ]
            )
            return
        super()._send_chunk(ident, token, data, index, ranges)
        if self.mode == "duplicate" and index == 0:
            forged = data[off : off + n].copy()
            forged[:] = 7
            self._sock.send_multipart(
                [
                    ident,
                    token,
                    bulk.DATA_FRAME,
                    bulk.CHUNK_HEADER.pack(index, len(ranges), off),
                    forged,
                ]
            )


def test_bulk_fetch_never_lets_a_duplicate_chunk_change_received_bytes() -> None:
    """Chunks land straight in the buffer while earlier ones are hashed on another thread: a
    second answer for a chunk already received must not touch the buffer (its bytes may be
    hashed already, so the payload would verify with other bytes than it returns)."""
    ctx = zmq.Context()
    server = _HostileBulkServer("duplicate", context=ctx)
    try:
        enc = _encoded(40_000)  # 160 kB in 16 kB chunks
        uri = server.offer(enc.data)
        data = fetch_bulk(
            uri, enc.total_bytes, enc.sha256, chunk_bytes=16_000, window=4, context=ctx
        )
        assert data.tobytes() == enc.data.tobytes()
    finally:
        server.close()
        ctx.term()


def test_bulk_fetch_rejects_a_chunk_longer_than_its_slot() -> None:
    ctx = zmq.Context()
    server = _HostileBulkServer("too_long", context=ctx)
    try:
        enc = _encoded(40_000)
        uri = server.offer(enc.data)
        with pytest.raises(PayloadRejected, match="does not match the expected layout"):
            fetch_bulk(uri, enc.total_bytes, enc.sha256, chunk_bytes=16_000, window=4, context=ctx)
    finally:
        server.close()
        ctx.term()


def test_bulk_fetch_times_out_when_server_gone(bulk_server) -> None:
    server, ctx = bulk_server
    enc = _encoded()
    uri = server.offer(enc.data)
    server.close()
    with pytest.raises(BulkUnreachable, match="bulk server tcp://127.0.0.1:[0-9]+ unreachable"):
        fetch_bulk(uri, enc.total_bytes, enc.sha256, idle_timeout_s=0.1, max_retries=2, context=ctx)


def test_parse_bulk_uri() -> None:
    assert bulk.parse_bulk_uri("tcp://10.0.0.5:5555/abc") == ("tcp://10.0.0.5:5555", b"abc")
    for bad in ("http://x:1/a", "tcp://x:1/", "tcp://x:1"):
        with pytest.raises(ValueError, match="bulk_uri"):
            bulk.parse_bulk_uri(bad)


# ------------------------------------------------------------------ Fast DDS profile


def test_fastdds_profile_exists_and_is_applied_only_if_present(tmp_path: Path) -> None:
    path = fastdds_profile_path()
    assert path is not None and path.name == "fastdds_shm.xml"
    text = path.read_text()
    assert (
        "<type>SHM</type>" in text and "<useBuiltinTransports>false</useBuiltinTransports>" in text
    )
    env: dict[str, str] = {}
    assert apply_fastdds_profile(env) == path and env["FASTDDS_DEFAULT_PROFILES_FILE"] == str(path)
    env = {}
    assert apply_fastdds_profile(env, path=tmp_path / "missing.xml") is None
    assert "FASTDDS_DEFAULT_PROFILES_FILE" not in env
    env = {"FASTDDS_DEFAULT_PROFILES_FILE": os.fspath(tmp_path / "user.xml")}
    assert apply_fastdds_profile(env) is None  # user's setting kept, reported missing
    assert env["FASTDDS_DEFAULT_PROFILES_FILE"] == os.fspath(tmp_path / "user.xml")


def test_transfer_limits_validate() -> None:
    with pytest.raises(ValueError, match="max_total_bytes"):
        TransferLimits(max_total_bytes=0)
    with pytest.raises(ValueError, match="payload_id"):
        ChunkedSender(_encoded(), "")
    assert isinstance(ChunkedSender(_encoded(), "p").chunk(0), TensorPayload)


# ------------------------------------------------- every transfer path, two processes


@pytest.mark.ros
def test_bench_transfer_runs_every_path_between_processes(ros_env, tmp_path: Path, capsys) -> None:
    """`fed-ros bench transfer` end to end, small payload: ROS 2 with the SHM profile and the
    zmq bulk channel deliver between processes (receivers verify sha256). The default-transport
    path is covered by test_interfaces_roundtrip.py."""
    from fed_ros.ros.bench.transfer import main

    out = tmp_path / "transfer.json"
    assert (
        main(
            [
                "--mb",
                "4",
                "--repeats",
                "1",
                "--warmup",
                "0",
                "--chunk-bytes",
                str(1 << 20),
                "--methods",
                "ros_tuned,zmq_bulk,memcpy",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    rows = json.loads(out.read_text())["rows"]
    assert [r["method"] for r in rows] == ["ros_tuned", "zmq_bulk", "memcpy"]
    assert all(len(r["times_s"]) == 1 and r["median_s"] > 0 for r in rows)
    assert "x raw pyzmq" in capsys.readouterr().out


# ------------------------------------------------------------------------ fuzzing

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from fed_ros.msg import TensorSpec as TensorSpecMsg  # noqa: E402

_U32, _U64 = (1 << 32) - 1, (1 << 64) - 1


@st.composite
def _chunks(draw) -> TensorPayload:
    specs = draw(
        st.lists(
            st.builds(
                lambda n, s, d: TensorSpecMsg(name=n, shape=s, dtype=d),
                st.sampled_from(["a", "b", "", "w"]),
                st.lists(st.integers(0, _U32), max_size=3),
                st.sampled_from(["float32", "float64", "int8", ""]),
            ),
            max_size=3,
        )
    )
    msg = TensorPayload(
        payload_id=draw(st.sampled_from(["p", "q", "", "x" * 300])),
        manifest=specs,
        encoding=draw(st.integers(0, 255)),
        total_bytes=draw(st.integers(0, _U64)),
        chunk_index=draw(st.integers(0, _U32)),
        chunk_count=draw(st.integers(0, _U32)),
        chunk_offset=draw(st.integers(0, _U64)),
        sha256=draw(st.sampled_from(["0" * 64, "g" * 64, "", "ab"])),
        bulk_uri=draw(st.sampled_from(["", "tcp://127.0.0.1:9/t"])),
    )
    msg.scales = draw(st.lists(st.floats(width=32), max_size=3))
    set_bytes_field(msg, "data", draw(st.binary(max_size=64)))
    if draw(st.booleans()):  # sometimes a consistent small header, so deeper checks are reached
        n = draw(st.integers(0, 8))
        msg.manifest = [TensorSpecMsg(name="w", shape=[n], dtype="float32")]
        msg.encoding, msg.total_bytes, msg.scales = TensorPayload.ENCODING_FLOAT32, 4 * n, []
        msg.chunk_count = draw(st.integers(1, 4))
        msg.chunk_index = draw(st.integers(0, msg.chunk_count - 1))
        msg.chunk_offset = draw(st.integers(0, 4 * n))
    return msg


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_chunks(), min_size=1, max_size=6))
def test_assembler_never_crashes_on_malformed_chunks(chunks: list[TensorPayload]) -> None:
    asm = PayloadAssembler(
        TransferLimits(max_total_bytes=1 << 16, max_chunk_bytes=1 << 12), max_pending=2
    )
    for chunk in chunks:
        try:
            done = asm.add(chunk)
        except PayloadRejected:
            continue
        if done is not None:  # only a payload whose bytes hash to the claimed sha256 completes
            assert sha256_hex(done.data) == chunk.sha256
    assert asm.pending_bytes <= 2 * (1 << 16)


def test_bulk_server_bind_and_advertised_host_from_environment(monkeypatch) -> None:
    monkeypatch.setenv("FED_ROS_BULK_BIND", "tcp://127.0.0.1:*")
    monkeypatch.setenv("FED_ROS_BULK_HOST", "robot-7.fleet.lan")
    ctx = zmq.Context()
    server = bulk.BulkServer(context=ctx)
    try:
        uri = server.offer(b"x" * 10)
        assert uri.startswith("tcp://robot-7.fleet.lan:") and len(uri.rsplit("/", 1)[1]) == 32
        # the advertised name is for other machines; locally fetch through the bound endpoint
        local = "tcp://127.0.0.1:" + uri.split(":")[2]
        assert fetch_bulk(local, 10, sha256_hex(b"x" * 10), context=ctx).tobytes() == b"x" * 10
    finally:
        server.close()
        ctx.term()


def test_50mb_update_arrives_intact_with_bounded_memory() -> None:
    """L7: 50 MB in 4 MiB chunks; assembly allocates the payload once, nothing per chunk."""
    import tracemalloc

    enc = encode_state_dict(
        {"w": np.random.default_rng(0).standard_normal(12_500_000, dtype=np.float32)}
    )
    sender = ChunkedSender(enc, "robot_9/r1/update")  # default 4 MiB chunks
    asm = PayloadAssembler(TransferLimits(max_total_bytes=64 << 20))
    tracemalloc.start()
    try:
        done = None
        for chunk in sender.chunks():
            done = asm.add(chunk) or done
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert done is not None and done.sha256 == enc.sha256
    assert np.array_equal(done.data, enc.data)
    assert enc.total_bytes <= peak < enc.total_bytes + (1 << 20), (
        f"assembly peaked at {peak} bytes for a {enc.total_bytes}-byte payload"
    )
