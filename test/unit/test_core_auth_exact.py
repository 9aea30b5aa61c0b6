"""Signing and authentication at their exact edges: fed_ros.core.security.auth, signed_messages and
replay.

What a reviewer of the fleet's authenticity needs to hold, stated as tests:

* the canonical byte strings a robot/server signs are exactly the documented encoding (a
  known-answer vector per message kind, written out by hand below, not rebuilt with the code
  under test), and every field is covered: change any one, the signature fails;
* Ed25519 sign/verify laws (hypothesis): round trip, any single-byte change of message or
  signature breaks verification, malformed keys/signatures are a plain False, never a crash;
* key files: 0600 on disk, refused when group/other can read them, errors that name the path
  and the offending value;
* allow-list decisions and YAML round trips, with the reject reason for each case;
* the replay guard at its exact edges: default window and capacity, eviction order, floor
  monotonicity, persistence round trip (state/load_state), atomic refusal of bad state.

Pure Python: no ROS, no MuJoCo, no torch, no sleeps, no wall clock. Keys are derived from
fixed seeds (Ed25519 signing is deterministic), so every run signs the same bytes.
"""

from __future__ import annotations

import hashlib
import math
import os
import stat
import struct
import warnings

import numpy as np
import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from hypothesis import given, settings, strategies as st

from fed_ros.core.security import auth, signed_messages as sm
from fed_ros.commands.keys import keys_main
from fed_ros.core.security import keys
from fed_ros.core.security import signed_messages
from fed_ros.core.security.auth import AllowList, Signer
from fed_ros.core.security.replay import ReplayGuard

PROPS = settings(max_examples=60, deadline=None, database=None, derandomize=True)

NONCE = bytes(range(16))
DIGEST = bytes(range(100, 132))  # 32 raw bytes
HDR = dict(base_round=2, num_samples=100, cluster_id=-1)


def seeded(seed: int) -> Signer:
    """A deterministic key pair (Ed25519 private key = 32 seed bytes)."""
    return Signer(Ed25519PrivateKey.from_private_bytes(bytes([seed]) * 32))


ALICE, BOB = seeded(1), seeded(2)


def u32(x: int) -> bytes:
    return x.to_bytes(4, "little")


def u64(x: int) -> bytes:
    return x.to_bytes(8, "little")


def i32(x: int) -> bytes:
    return x.to_bytes(4, "little", signed=True)


def blob(raw: bytes) -> bytes:
    return u64(len(raw)) + raw


def flip(data: bytes, i: int) -> bytes:
    return data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1 :]


# ===================================================== canonical encodings


def test_update_message_known_answer():
    transfer = b"\xaa" * 32
    msg = signed_messages.update_message(
        7,
        "robot_0",
        NONCE,
        DIGEST.hex(),
        base_round=5,
        num_samples=300,
        cluster_id=-2,
        transfer=transfer,
    )
    expected = (
        b"fed_ros/update/v2"
        + u32(7)
        + bytes([7])
        + b"robot_0"
        + NONCE
        + DIGEST
        + u32(5)
        + u64(300)
        + i32(-2)
        + blob(transfer)
    )
    assert msg == expected
    # Raw digest bytes and their hex spelling are the same field.
    assert (
        signed_messages.update_message(
            7,
            "robot_0",
            NONCE,
            DIGEST,
            base_round=5,
            num_samples=300,
            cluster_id=-2,
            transfer=transfer,
        )
        == expected
    )
    # No transfer: an empty length-prefixed blob, not an absent field.
    assert signed_messages.update_message(
        7, "robot_0", NONCE, DIGEST, base_round=5, num_samples=300, cluster_id=-2
    ) == expected[:-40] + u64(0)


def test_update_message_known_answer_at_the_field_maxima():
    """Every fixed-width field at its largest value: unsigned where the field is a count/round."""
    rid = "r" * 255
    msg = signed_messages.update_message(
        2**32 - 1,
        rid,
        NONCE,
        DIGEST,
        base_round=2**32 - 1,
        num_samples=2**64 - 1,
        cluster_id=-(2**31),
    )
    assert msg == (
        b"fed_ros/update/v2"
        + b"\xff" * 4
        + b"\xff"
        + rid.encode()
        + NONCE
        + DIGEST
        + b"\xff" * 4
        + b"\xff" * 8
        + b"\x00\x00\x00\x80"
        + u64(0)
    )


def test_descriptor_message_known_answer():
    msg = signed_messages.descriptor_message(2**32 - 1, "r\u00e9", NONCE, DIGEST)
    assert (
        msg
        == b"fed_ros/descriptor/v1"
        + u32(2**32 - 1)
        + bytes([3])
        + "r\u00e9".encode()
        + NONCE
        + DIGEST
    )


def test_cluster_model_message_known_answer():
    msg = signed_messages.cluster_model_message(
        9, -1, DIGEST, transfer=b"\x01\x02", members=["robot_1", "r\u00e9"]
    )
    assert msg == (
        b"fed_ros/cluster_model/v2"
        + u32(9)
        + i32(-1)
        + DIGEST
        + blob(b"\x01\x02")
        + u64(2)
        + blob(b"robot_1")
        + blob("r\u00e9".encode())
    )
    assert signed_messages.cluster_model_message(9, 0, DIGEST) == (
        b"fed_ros/cluster_model/v2" + u32(9) + i32(0) + DIGEST + blob(b"") + u64(0)
    )


def test_control_message_known_answer():
    assert signed_messages.control_message("round", b"\x00body") == b"fed_ros/control/v1" + blob(
        b"round"
    ) + blob(b"\x00body")
    assert signed_messages.control_message("resend", b"") == b"fed_ros/control/v1" + blob(
        b"resend"
    ) + blob(b"")


def test_transfer_digest_known_answer():
    chunks = hashlib.sha256(b"c0").digest() + hashlib.sha256(b"c1").digest()
    got = signed_messages.transfer_digest(
        payload_id="p-1",
        encoding=2,
        total_bytes=1000,
        chunk_count=2,
        manifest=[("w", (3, 4), "float32"), ("b", [4], "int8")],
        scales=b"\x01\x02",
        chunk_sha256=chunks,
        bulk_uri="tcp://h:1",
    )
    pre = (
        b"fed_ros/transfer/v1"
        + blob(b"p-1")
        + bytes([2])
        + u64(1000)
        + u32(2)
        + u64(2)
        + blob(b"w")
        + blob(b"float32")
        + u64(2)
        + u64(3)
        + u64(4)
        + blob(b"b")
        + blob(b"int8")
        + u64(1)
        + u64(4)
        + blob(b"\x01\x02")
        + blob(chunks)
        + blob(b"tcp://h:1")
    )
    assert got == hashlib.sha256(pre).digest()
    # Defaults: no scales, no chunk list, no bulk address -> three empty blobs.
    bare = signed_messages.transfer_digest(
        payload_id="", encoding=0, total_bytes=0, chunk_count=0, manifest=[]
    )
    assert (
        bare
        == hashlib.sha256(
            b"fed_ros/transfer/v1"
            + blob(b"")
            + bytes([0])
            + u64(0)
            + u32(0)
            + u64(0)
            + blob(b"") * 3
        ).digest()
    )


def test_transfer_digest_known_answer_at_the_field_maxima():
    got = signed_messages.transfer_digest(
        payload_id="p",
        encoding=255,
        total_bytes=2**64 - 1,
        chunk_count=2**32 - 1,
        manifest=[("w", (2**63 - 1,), "f")],
    )
    pre = (
        b"fed_ros/transfer/v1"
        + blob(b"p")
        + b"\xff"
        + b"\xff" * 8
        + b"\xff" * 4
        + u64(1)
        + blob(b"w")
        + blob(b"f")
        + u64(1)
        + u64(2**63 - 1)
        + blob(b"") * 3
    )
    assert got == hashlib.sha256(pre).digest()


def test_transfer_digest_covers_every_header_field():
    base = dict(
        payload_id="p",
        encoding=1,
        total_bytes=64,
        chunk_count=2,
        manifest=[("w", (2, 8), "float32")],
        scales=b"",
        chunk_sha256=b"\x11" * 64,
        bulk_uri="",
    )
    d = signed_messages.transfer_digest(**base)
    changes = dict(
        payload_id="q",
        encoding=2,
        total_bytes=65,
        chunk_count=3,
        manifest=[("w", (8, 2), "float32")],
        scales=b"\x00",
        chunk_sha256=b"\x12" + b"\x11" * 63,
        bulk_uri="tcp://evil:1",
    )
    for field, value in changes.items():
        assert signed_messages.transfer_digest(**{**base, field: value}) != d, field
    for manifest in (
        [("v", (2, 8), "float32")],
        [("w", (2, 8), "int8")],
        [("w", (16,), "float32")],
        [],
    ):
        assert signed_messages.transfer_digest(**{**base, "manifest": manifest}) != d, manifest


@pytest.mark.parametrize(
    "field, value, ok",
    [
        ("total_bytes", 2**64 - 1, True),
        ("total_bytes", 2**64, False),
        ("total_bytes", -1, False),
        ("total_bytes", 0, True),
        ("total_bytes", True, False),
        ("total_bytes", 1.0, False),
        ("chunk_count", 2**32 - 1, True),
        ("chunk_count", 2**32, False),
        ("chunk_count", -1, False),
        ("chunk_count", 0, True),
        ("chunk_count", np.uint32(5), True),
        ("chunk_count", False, False),
    ],
)
def test_transfer_digest_integer_ranges(field, value, ok):
    base = dict(payload_id="p", encoding=0, total_bytes=1, chunk_count=1, manifest=[])
    if ok:
        assert len(signed_messages.transfer_digest(**{**base, field: value})) == 32
    else:
        kind = "uint64" if field == "total_bytes" else "uint32"
        with pytest.raises(ValueError, match=rf"^{field} must be a {kind}, got {value!r}$"):
            signed_messages.transfer_digest(**{**base, field: value})


@pytest.mark.parametrize(
    "size, ok", [(0, True), (32, True), (64, True), (31, False), (33, False), (1, False)]
)
def test_transfer_digest_chunk_list_is_whole_sha256s(size, ok):
    call = lambda: signed_messages.transfer_digest(
        payload_id="p",
        encoding=0,
        total_bytes=0,
        chunk_count=0,  # noqa: E731
        manifest=[],
        chunk_sha256=b"\x00" * size,
    )
    if ok:
        assert len(call()) == 32
    else:
        with pytest.raises(
            ValueError, match=rf"^chunk_sha256 must be 32 bytes per chunk, got {size} bytes$"
        ):
            call()


def test_descriptor_digest_known_answer():
    got = signed_messages.descriptor_digest(
        kind="gauss",
        dims=2,
        mean=[1.0, -2.5],
        variance=np.array([0.5, 4.0]),
        num_samples=10,
        payload=b"\x09\x08",
        scores={"b": 2.0, "a": 0.25},
        residual_std=1.5,
    )
    f32 = lambda *v: struct.pack(f"<{len(v)}f", *v)  # noqa: E731  (IEEE-754 binary32, little-endian)
    pre = (
        (5).to_bytes(2, "little")
        + b"gauss"
        + u64(2)
        + u64(10)
        + u64(2)
        + f32(1.0, -2.5)
        + u64(2)
        + f32(0.5, 4.0)
        + blob(b"\x09\x08")
        + u64(2)
        + (1).to_bytes(2, "little")
        + b"a"
        + u64(1)
        + f32(0.25)
        + (1).to_bytes(2, "little")
        + b"b"
        + u64(1)
        + f32(2.0)
        + u64(1)
        + f32(1.5)
    )
    assert got == hashlib.sha256(pre).digest()


def test_descriptor_digest_text_length_prefixes_are_uint16():
    """kind and score ids carry a 16-bit unsigned length: 40000-byte strings hash, as both ends
    agree."""
    kind, rid = "k" * 40000, "r" * 40000
    got = signed_messages.descriptor_digest(
        kind=kind,
        dims=0,
        mean=None,
        variance=None,
        num_samples=0,
        scores={rid: 1.0},
        residual_std=2.0,
    )
    pre = (
        (40000).to_bytes(2, "little")
        + kind.encode()
        + u64(0) * 4
        + blob(b"")
        + u64(1)
        + (40000).to_bytes(2, "little")
        + rid.encode()
        + u64(1)
        + struct.pack("<f", 1.0)
        + u64(1)
        + struct.pack("<f", 2.0)
    )
    assert got == hashlib.sha256(pre).digest()


def test_descriptor_digest_defaults_and_absent_vectors():
    got = signed_messages.descriptor_digest(kind="k", dims=0, mean=None, variance=[], num_samples=0)
    nan = np.float32("nan").tobytes()
    pre = (
        (1).to_bytes(2, "little")
        + b"k"
        + u64(0)
        + u64(0)
        + u64(0)
        + u64(0)
        + blob(b"")
        + u64(0)
        + u64(1)
        + nan
    )
    assert got == hashlib.sha256(pre).digest()
    # Absent and empty vectors travel the same way, so they hash the same.
    assert got == signed_messages.descriptor_digest(
        kind="k", dims=0, mean=[], variance=None, num_samples=0
    )
    assert got == signed_messages.descriptor_digest(
        kind="k",
        dims=0,
        mean=None,
        variance=None,
        num_samples=0,
        payload=None,
        scores={},
        residual_std=math.nan,
    )


def test_descriptor_digest_canonicalises_nan_and_overflow():
    base = dict(kind="k", dims=2, num_samples=1, variance=[1.0, 1.0])
    quiet = np.array([np.nan, 1.0], dtype=np.float32)
    other_nan = np.array([0, 1.0], dtype=np.float32)
    other_nan.view(np.uint32)[0] = 0x7FC00123  # a NaN with a payload: a different bit pattern
    assert np.isnan(other_nan[0]) and other_nan.tobytes() != quiet.tobytes()
    assert signed_messages.descriptor_digest(
        **base, mean=quiet
    ) == signed_messages.descriptor_digest(**base, mean=other_nan)
    assert other_nan.view(np.uint32)[0] == 0x7FC00123  # the caller's array is left as it was
    neg_nan = np.array([0, 1.0], dtype=np.float32)
    neg_nan.view(np.uint32)[0] = 0xFFC00000
    assert signed_messages.descriptor_digest(
        **base, mean=quiet
    ) == signed_messages.descriptor_digest(**base, mean=neg_nan)
    # The canonical NaN does not destroy the finite values next to it.
    assert signed_messages.descriptor_digest(
        **base, mean=quiet
    ) != signed_messages.descriptor_digest(**base, mean=[np.nan, 2.0])
    # Out-of-float32-range values become inf (as on the wire), without a warning or error.
    with np.errstate(all="raise"):
        assert signed_messages.descriptor_digest(
            **base, mean=[1e39, 1.0]
        ) == signed_messages.descriptor_digest(**base, mean=[np.inf, 1.0])
    # A float64 signalling NaN (the cast to float32 flags it 'invalid') hashes like any NaN,
    # silently.
    snan = np.array([0.0, 1.0])
    snan.view(np.uint64)[0] = 0x7FF0000000000001
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert signed_messages.descriptor_digest(
            **base, mean=snan
        ) == signed_messages.descriptor_digest(**base, mean=quiet)
    # NaN residual std (the default) differs from inf and from a number.
    assert signed_messages.descriptor_digest(
        **base, mean=quiet
    ) != signed_messages.descriptor_digest(**base, mean=quiet, residual_std=0.0)


def test_descriptor_digest_covers_every_field():
    base = dict(
        kind="gaussian",
        dims=3,
        mean=[1.0, 2.0, 3.0],
        variance=[0.1, 0.2, 0.3],
        num_samples=10,
        payload=b"p",
        scores={"a": 1.0},
        residual_std=0.5,
    )
    d = signed_messages.descriptor_digest(**base)
    changes = dict(
        kind="gaussiaN",
        dims=4,
        mean=[1.0, 2.0, 3.5],
        variance=[0.1, 0.2],
        num_samples=11,
        payload=b"q",
        scores={"a": 1.5},
        residual_std=0.25,
    )
    for field, value in changes.items():
        assert signed_messages.descriptor_digest(**{**base, field: value}) != d, field
    assert signed_messages.descriptor_digest(**{**base, "scores": {"b": 1.0}}) != d
    assert signed_messages.descriptor_digest(**{**base, "scores": {}}) != d
    assert signed_messages.descriptor_digest(
        **{**base, "scores": None}
    ) == signed_messages.descriptor_digest(**{**base, "scores": {}})
    assert signed_messages.descriptor_digest(
        **{**base, "payload": None}
    ) == signed_messages.descriptor_digest(**{**base, "payload": b""})


def test_descriptor_digest_sizes_wrap_to_uint64():
    """dims and num_samples enter as uint64: a negative count hashes as its two's complement, never
    raises."""
    base = dict(kind="k", mean=None, variance=None)
    tail = u64(0) + u64(0) + blob(b"") + u64(0) + u64(1) + np.float32("nan").tobytes()
    for dims, num_samples in ((1000, 70000), (2**64 - 1, 2**63), (-1, -2)):
        pre = (1).to_bytes(2, "little") + b"k" + u64(dims % 2**64) + u64(num_samples % 2**64) + tail
        assert (
            signed_messages.descriptor_digest(**base, dims=dims, num_samples=num_samples)
            == hashlib.sha256(pre).digest()
        )
    assert signed_messages.descriptor_digest(
        **base, dims=-1, num_samples=-2
    ) == signed_messages.descriptor_digest(**base, dims=2**64 - 1, num_samples=2**64 - 2)
    assert signed_messages.descriptor_digest(
        **base, dims=2**64 + 3, num_samples=2**64
    ) == signed_messages.descriptor_digest(**base, dims=3, num_samples=0)


# ===================================================== field validation


@pytest.mark.parametrize(
    "value, ok",
    [
        (-(2**31), True),
        (2**31 - 1, True),
        (np.int32(-5), True),
        (-(2**31) - 1, False),
        (2**31, False),
        (True, False),
        (np.bool_(False), False),
        (1.0, False),
        ("1", False),
    ],
)
def test_cluster_id_is_int32_and_not_bool(value, ok):
    if ok:
        msg = signed_messages.cluster_model_message(0, value, DIGEST)
        assert msg[len(b"fed_ros/cluster_model/v2") + 4 :][:4] == i32(int(value))
    else:
        with pytest.raises(ValueError, match=rf"^cluster id must be an int32, got {value!r}$"):
            signed_messages.cluster_model_message(0, value, DIGEST)


@pytest.mark.parametrize("field", ["round", "base_round"])
@pytest.mark.parametrize(
    "value, why",
    [
        (-1, "in [0, 2**32)"),
        (2**32, "in [0, 2**32)"),
        (True, "an integer"),
        (1.0, "an integer"),
        (None, "an integer"),
    ],
)
def test_rounds_are_uint32_integers(field, value, why):
    kw = dict(HDR)
    round_idx = 1
    if field == "round":
        round_idx = value
    else:
        kw["base_round"] = value
    with pytest.raises(
        ValueError, match=rf"^{field} must be {__import__('re').escape(why)}, got {value!r}$"
    ):
        signed_messages.update_message(round_idx, "r", NONCE, DIGEST, **kw)


def test_round_accepts_numpy_integers():
    assert signed_messages.descriptor_message(
        np.uint32(2**32 - 1), "r", NONCE, DIGEST
    ) == signed_messages.descriptor_message(2**32 - 1, "r", NONCE, DIGEST)
    assert signed_messages.descriptor_message(
        np.int64(0), "r", NONCE, DIGEST
    ) == signed_messages.descriptor_message(0, "r", NONCE, DIGEST)


@pytest.mark.parametrize("value", [True, 1.0, -1, 2**64, np.bool_(True)])
def test_num_samples_is_uint64_integer(value):
    with pytest.raises(ValueError, match=rf"^num_samples must be a uint64, got {value!r}$"):
        signed_messages.update_message(
            1, "r", NONCE, DIGEST, base_round=0, num_samples=value, cluster_id=0
        )


def test_robot_id_errors_name_the_value():
    for bad in ("", None, 5, b"robot_0"):
        with pytest.raises(
            ValueError, match=rf"^robot id must be a non-empty string, got {bad!r}$"
        ):
            sm.robot_id_bytes(bad)
    long = "x" * 300
    with pytest.raises(
        ValueError, match=r"^robot id longer than 255 bytes: '" + "x" * 40 + r"'\.\.\.$"
    ):
        sm.robot_id_bytes(long)
    assert sm.robot_id_bytes("r\u00e9") == b"r\xc3\xa9"


def test_digest_field_errors():
    for what, call in (
        ("payload sha256", lambda d: signed_messages.update_message(1, "r", NONCE, d, **HDR)),
        ("descriptor digest", lambda d: signed_messages.descriptor_message(1, "r", NONCE, d)),
        ("payload sha256", lambda d: signed_messages.cluster_model_message(1, 0, d)),
    ):
        with pytest.raises(ValueError, match=rf"^{what} is not hex: 'zz'$"):
            call("zz")
        with pytest.raises(
            ValueError, match=rf"^{what} is not hex: '{'g' * 80}'$"
        ):  # truncated to 80 chars
            call("g" * 200)
        with pytest.raises(ValueError, match=rf"^{what} must be hex str or bytes, got int$"):
            call(5)
        with pytest.raises(ValueError, match=rf"^{what} must be 32 bytes \(sha256\), got 31$"):
            call(b"\x00" * 31)
        with pytest.raises(ValueError, match=rf"^{what} must be 32 bytes \(sha256\), got 33$"):
            call("ab" * 33)
        # bytearray / memoryview / upper-case hex are the same digest.
        assert (
            call(bytearray(DIGEST))
            == call(DIGEST)
            == call(memoryview(DIGEST))
            == call(DIGEST.hex().upper())
        )


def test_nonce_field_errors():
    with pytest.raises(ValueError, match=r"^nonce must be bytes, got str$"):
        signed_messages.descriptor_message(1, "r", "a" * 16, DIGEST)
    with pytest.raises(ValueError, match=r"^nonce must be 16 bytes, got 17$"):
        signed_messages.descriptor_message(1, "r", b"a" * 17, DIGEST)
    assert signed_messages.descriptor_message(
        1, "r", bytearray(NONCE), DIGEST
    ) == signed_messages.descriptor_message(1, "r", NONCE, DIGEST)
    assert signed_messages.descriptor_message(
        1, "r", memoryview(NONCE), DIGEST
    ) == signed_messages.descriptor_message(1, "r", NONCE, DIGEST)


@pytest.mark.parametrize("forged", [False, 0, 3, None, 1.5])
def test_transfer_field_refuses_non_buffers(forged):
    """bytes(False)/bytes(0) would encode like b'' and keep a signature over 'no transfer' valid."""
    with pytest.raises(ValueError, match=rf"^expected bytes or str, got {type(forged).__name__}$"):
        signed_messages.update_message(1, "r", NONCE, DIGEST, **HDR, transfer=forged)
    with pytest.raises(ValueError, match=rf"^expected bytes or str, got {type(forged).__name__}$"):
        signed_messages.cluster_model_message(1, 0, DIGEST, transfer=forged)


def test_transfer_field_refuses_text():
    for call in (
        lambda t: signed_messages.update_message(1, "r", NONCE, DIGEST, **HDR, transfer=t),
        lambda t: signed_messages.cluster_model_message(1, 0, DIGEST, transfer=t),
    ):
        with pytest.raises(ValueError, match=r"^transfer must be bytes, got str$"):
            call("")
        assert call(bytearray(b"\x01")) == call(b"\x01") == call(memoryview(b"\x01"))


def test_blob_fields_take_text_as_utf8():
    assert signed_messages.control_message("r\u00e9", "\u00e9") == signed_messages.control_message(
        "r\u00e9", "\u00e9".encode()
    )
    with pytest.raises(ValueError, match=r"^expected bytes or str, got int$"):
        signed_messages.control_message("round", 0)


def test_new_nonce_and_sha256_hex():
    nonces = {signed_messages.new_nonce() for _ in range(8)}
    assert len(nonces) == 8 and all(
        isinstance(n, bytes) and len(n) == signed_messages.NONCE_BYTES == 16 for n in nonces
    )
    assert (
        signed_messages.sha256_hex(b"abc")
        == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    )
    assert signed_messages.sha256_hex(
        np.frombuffer(b"abc", dtype=np.uint8)
    ) == signed_messages.sha256_hex(memoryview(b"abc"))


# ===================================================== signatures cover every field

UPDATE = dict(
    round_idx=3,
    robot_id="robot_0",
    nonce=NONCE,
    payload_sha256=DIGEST.hex(),
    base_round=2,
    num_samples=100,
    cluster_id=1,
    transfer=b"\x33" * 32,
)
UPDATE_CHANGES = dict(
    round_idx=4,
    robot_id="robot_1",
    nonce=NONCE[::-1],
    payload_sha256=DIGEST[::-1].hex(),
    base_round=1,
    num_samples=101,
    cluster_id=2,
    transfer=b"\x33" * 31 + b"\x34",
)


def verify_update(allow: AllowList, f: dict, sig: bytes) -> str | None:
    return allow.verify_update(
        f["robot_id"],
        f["round_idx"],
        f["nonce"],
        f["payload_sha256"],
        sig,
        base_round=f["base_round"],
        num_samples=f["num_samples"],
        cluster_id=f["cluster_id"],
        transfer=f["transfer"],
    )


@pytest.mark.parametrize("field", sorted(UPDATE_CHANGES))
def test_update_signature_covers_each_field(field):
    allow = AllowList({"robot_0": ALICE.public_key, "robot_1": ALICE.public_key})
    sig = ALICE.sign_update(
        UPDATE["round_idx"],
        UPDATE["robot_id"],
        UPDATE["nonce"],
        UPDATE["payload_sha256"],
        base_round=UPDATE["base_round"],
        num_samples=UPDATE["num_samples"],
        cluster_id=UPDATE["cluster_id"],
        transfer=UPDATE["transfer"],
    )
    assert verify_update(allow, UPDATE, sig) is None
    changed = {**UPDATE, field: UPDATE_CHANGES[field]}
    assert (
        verify_update(allow, changed, sig)
        == f"robot {changed['robot_id']!r}: bad signature (64 bytes)"
    )


def test_update_signature_default_transfer_is_empty():
    sig = ALICE.sign_update(3, "robot_0", NONCE, DIGEST, **HDR)
    allow = AllowList({"robot_0": ALICE.public_key})
    assert allow.verify_update("robot_0", 3, NONCE, DIGEST, sig, **HDR) is None
    assert allow.verify_update("robot_0", 3, NONCE, DIGEST, sig, **HDR, transfer=b"") is None
    assert (
        allow.verify_update("robot_0", 3, NONCE, DIGEST, sig, **HDR, transfer=b"\x00") is not None
    )


@pytest.mark.parametrize("field", ["round_idx", "robot_id", "nonce", "digest"])
def test_descriptor_signature_covers_each_field(field):
    f = dict(round_idx=3, robot_id="robot_0", nonce=NONCE, digest=DIGEST)
    changes = dict(round_idx=2, robot_id="robot_1", nonce=NONCE[::-1], digest=DIGEST[::-1])
    allow = AllowList({"robot_0": ALICE.public_key, "robot_1": ALICE.public_key})
    sig = ALICE.sign_descriptor(f["round_idx"], f["robot_id"], f["nonce"], f["digest"])
    assert sig == ALICE.sign(signed_messages.descriptor_message(3, "robot_0", NONCE, DIGEST))
    assert (
        allow.verify_descriptor(f["robot_id"], f["round_idx"], f["nonce"], f["digest"], sig) is None
    )
    g = {**f, field: changes[field]}
    assert (
        allow.verify_descriptor(g["robot_id"], g["round_idx"], g["nonce"], g["digest"], sig)
        == f"robot {g['robot_id']!r}: bad signature (64 bytes)"
    )


def test_cluster_model_signature_covers_each_field():
    base = dict(
        round_idx=5,
        cluster_id=1,
        payload_sha256=DIGEST,
        transfer=b"\x01" * 32,
        members=("robot_0", "robot_1"),
    )
    sig = ALICE.sign_cluster_model(**base)
    ok = lambda f: auth.verify_signature(
        ALICE.public_key, signed_messages.cluster_model_message(**f), sig
    )  # noqa: E731
    assert ok(base)
    for field, value in dict(
        round_idx=6,
        cluster_id=0,
        payload_sha256=DIGEST[::-1],
        transfer=b"\x01" * 31,
        members=("robot_0",),
    ).items():
        assert not ok({**base, field: value}), field
    # Membership is an ordered list of separate names: no re-splitting, no reordering.
    assert not ok({**base, "members": ("robot_1", "robot_0")})
    assert not ok({**base, "members": ("robot_0robot_1",)})
    assert not ok({**base, "members": ("robot_0", "robot_1", "")})
    # Defaults: no transfer, no members.
    bare = ALICE.sign_cluster_model(5, 1, DIGEST)
    assert auth.verify_signature(
        ALICE.public_key,
        signed_messages.cluster_model_message(5, 1, DIGEST, transfer=b"", members=[]),
        bare,
    )


def test_signatures_are_domain_separated_across_all_kinds():
    """The same key signs five kinds of message: none is valid as another."""
    messages = {
        "update": signed_messages.update_message(
            1, "r", NONCE, DIGEST, base_round=0, num_samples=0, cluster_id=0
        ),
        "descriptor": signed_messages.descriptor_message(1, "r", NONCE, DIGEST),
        "cluster_model": signed_messages.cluster_model_message(1, 0, DIGEST),
        "control": signed_messages.control_message("round", b""),
        "control_other_kind": signed_messages.control_message("resend", b""),
    }
    sigs = {k: ALICE.sign(m) for k, m in messages.items()}
    for k, m in messages.items():
        for j, s in sigs.items():
            assert auth.verify_signature(ALICE.public_key, m, s) == (k == j), (k, j)


# ===================================================== Ed25519 laws (hypothesis)


@PROPS
@given(seed=st.binary(min_size=32, max_size=32), message=st.binary(max_size=256))
def test_sign_verify_round_trip(seed, message):
    signer = Signer(Ed25519PrivateKey.from_private_bytes(seed))
    sig = signer.sign(message)
    assert len(sig) == auth.SIGNATURE_BYTES == 64
    assert auth.verify_signature(signer.public_key, message, sig)
    assert auth.verify_signature(
        signer.private_key.public_key(), message, sig
    )  # key object or raw bytes
    assert auth.verify_signature(signer.public_key, message, bytearray(sig))
    assert auth.verify_signature(signer.public_key, message, memoryview(sig))


@PROPS
@given(message=st.binary(min_size=1, max_size=200), data=st.data())
def test_any_single_byte_change_breaks_verification(message, data):
    sig = ALICE.sign(message)
    i = data.draw(st.integers(0, len(message) - 1), label="message byte")
    delta = data.draw(st.integers(1, 255), label="xor")
    changed = message[:i] + bytes([message[i] ^ delta]) + message[i + 1 :]
    assert not auth.verify_signature(ALICE.public_key, changed, sig)
    j = data.draw(st.integers(0, len(sig) - 1), label="signature byte")
    assert not auth.verify_signature(
        ALICE.public_key, message, sig[:j] + bytes([sig[j] ^ delta]) + sig[j + 1 :]
    )
    assert not auth.verify_signature(BOB.public_key, message, sig)
    # Truncated or extended messages and signatures are different too.
    assert not auth.verify_signature(ALICE.public_key, message[:-1], sig)
    assert not auth.verify_signature(ALICE.public_key, message + b"\x00", sig)


@PROPS
@given(
    round_idx=st.integers(0, 2**32 - 1),
    robot_id=st.text(min_size=1, max_size=20),
    base_round=st.integers(0, 2**32 - 1),
    num_samples=st.integers(0, 2**64 - 1),
    cluster_id=st.integers(-(2**31), 2**31 - 1),
    transfer=st.binary(max_size=40),
    nonce=st.binary(min_size=16, max_size=16),
    digest=st.binary(min_size=32, max_size=32),
)
def test_update_round_trip_through_the_allow_list(
    round_idx, robot_id, base_round, num_samples, cluster_id, transfer, nonce, digest
):
    allow = AllowList({robot_id: ALICE.public_key})
    hdr = dict(
        base_round=base_round, num_samples=num_samples, cluster_id=cluster_id, transfer=transfer
    )
    sig = ALICE.sign_update(round_idx, robot_id, nonce, digest, **hdr)
    assert allow.verify_update(robot_id, round_idx, nonce, digest.hex(), sig, **hdr) is None
    assert allow.verify_update(robot_id, round_idx, nonce, digest, flip(sig, 0), **hdr) is not None


@PROPS
@given(
    a=st.tuples(st.text(min_size=1, max_size=6), st.binary(max_size=6)),
    b=st.tuples(st.text(min_size=1, max_size=6), st.binary(max_size=6)),
)
def test_control_encoding_is_injective(a, b):
    """Length prefixes: (kind, body) pairs never collide, e.g. ('ab', 'c') vs ('a', 'bc')."""
    assert (signed_messages.control_message(*a) == signed_messages.control_message(*b)) == (a == b)


@PROPS
@given(a=st.lists(st.text(max_size=4), max_size=4), b=st.lists(st.text(max_size=4), max_size=4))
def test_cluster_member_encoding_is_injective(a, b):
    assert (
        signed_messages.cluster_model_message(0, 0, DIGEST, members=a)
        == signed_messages.cluster_model_message(0, 0, DIGEST, members=b)
    ) == (a == b)


# ===================================================== keys


def test_verify_signature_is_false_on_malformed_input_never_raises():
    msg = b"m"
    sig = ALICE.sign(msg)
    assert auth.verify_signature(ALICE.public_key, msg, sig)
    for bad_sig in (sig[:63], sig + b"\x00", b"", None, "x" * 64, list(sig)):
        assert auth.verify_signature(ALICE.public_key, msg, bad_sig) is False
    for bad_key in (ALICE.public_key[:31], b"", "zz", ALICE.public_key.hex()[:-2], None):
        assert auth.verify_signature(bad_key, msg, sig) is False
    # A hex public key is a key too.
    assert auth.verify_signature(ALICE.public_key.hex(), msg, sig) is True


def test_public_key_from_bytes_forms_and_errors():
    raw = ALICE.public_key
    for form in (raw, bytearray(raw), memoryview(raw), raw.hex(), "  " + raw.hex().upper() + "\n"):
        assert keys.raw_public_key(keys.public_key_from_bytes(form)) == raw
    with pytest.raises(ValueError, match=r"^public key is not hex: 'nothex'$"):
        keys.public_key_from_bytes("nothex")
    with pytest.raises(ValueError, match=rf"^public key is not hex: '{'q' * 80}'$"):
        keys.public_key_from_bytes("q" * 100)
    with pytest.raises(ValueError, match=r"^public key must be 32 raw bytes, got 31$"):
        keys.public_key_from_bytes(raw[:31])
    with pytest.raises(ValueError, match=r"^public key must be 32 raw bytes, got 33$"):
        keys.public_key_from_bytes(raw.hex() + "00")
    with pytest.raises(ValueError, match=r"^public key must be 32 raw bytes, got int$"):
        keys.public_key_from_bytes(7)
    with pytest.raises(ValueError, match=r"^public key must be 32 raw bytes, got NoneType$"):
        keys.public_key_from_bytes(None)


def test_raw_public_key_of_private_and_public_keys():
    priv = Ed25519PrivateKey.from_private_bytes(bytes([1]) * 32)
    expected = priv.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    assert (
        keys.raw_public_key(priv)
        == keys.raw_public_key(priv.public_key())
        == ALICE.public_key
        == expected
    )
    assert len(expected) == keys.PUBLIC_KEY_BYTES == 32
    assert isinstance(keys.public_key_from_bytes(expected), Ed25519PublicKey)


def test_signer_helpers_sign_the_canonical_messages():
    s = ALICE
    assert s.sign_update(
        3, "r", NONCE, DIGEST, base_round=1, num_samples=2, cluster_id=3, transfer=b"t"
    ) == s.sign(
        signed_messages.update_message(
            3, "r", NONCE, DIGEST, base_round=1, num_samples=2, cluster_id=3, transfer=b"t"
        )
    )
    assert s.sign_cluster_model(3, 1, DIGEST, transfer=b"t", members=["a"]) == s.sign(
        signed_messages.cluster_model_message(3, 1, DIGEST, transfer=b"t", members=["a"])
    )
    assert s.sign_control("round", b"body") == s.sign(
        signed_messages.control_message("round", b"body")
    )
    assert Signer.generate().public_key != Signer.generate().public_key


def test_save_writes_0600_pem_and_hex_pub(tmp_path):
    path = ALICE.save(tmp_path / "deep" / "dir" / "robot_0.key")  # parents are created
    assert path == tmp_path / "deep" / "dir" / "robot_0.key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")  # PKCS#8, unencrypted
    assert (tmp_path / "deep" / "dir" / "robot_0.pub").read_text() == ALICE.public_key.hex() + "\n"
    assert not (tmp_path / "deep" / "dir" / "robot_0.key.tmp").exists()
    assert Signer.from_file(path).public_key == ALICE.public_key
    assert keys.load_public_key(tmp_path / "deep" / "dir" / "robot_0.pub") == ALICE.public_key


def test_save_replaces_an_existing_key_and_a_stale_tmp(tmp_path):
    path = tmp_path / "robot_0.key"
    ALICE.save(path)
    stale = tmp_path / "robot_0.key.tmp"  # left over by a crash between create and rename
    stale.write_bytes(b"junk")
    os.chmod(stale, 0o644)
    BOB.save(path)
    assert not stale.exists()
    assert Signer.from_file(path).public_key == BOB.public_key
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert keys.load_public_key(tmp_path / "robot_0.pub") == BOB.public_key


def test_save_under_umask_zero_is_still_0600(tmp_path):
    old = os.umask(0)
    try:
        path = ALICE.save(tmp_path / "k.key")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_public_key_path():
    assert keys.public_key_path("keys/robot_0.key") == auth.Path("keys/robot_0.pub")
    assert keys.public_key_path("keys/robot_0") == auth.Path("keys/robot_0.pub")
    assert keys.public_key_path("keys/robot_0.pem") == auth.Path("keys/robot_0.pem.pub")


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o601, 0o610, 0o620, 0o602, 0o644, 0o666])
def test_private_key_readable_by_group_or_others_is_refused(tmp_path, mode):
    path = ALICE.save(tmp_path / "robot_0.key")
    os.chmod(path, mode)
    expected = (
        f"private key {str(path)!r} has mode {mode:04o}; it must not be readable by group/others "
        f"(chmod 600 {path})"
    )
    with pytest.raises(ValueError) as err:
        keys.load_private_key(path)
    assert str(err.value) == expected


@pytest.mark.parametrize("mode", [0o600, 0o400, 0o700])
def test_private_key_owner_only_modes_load(tmp_path, mode):
    path = ALICE.save(tmp_path / "robot_0.key")
    os.chmod(path, mode)
    assert keys.raw_public_key(keys.load_private_key(path)) == ALICE.public_key


def test_private_key_missing_or_a_directory(tmp_path):
    missing = tmp_path / "nope.key"
    with pytest.raises(ValueError) as err:
        keys.load_private_key(missing)
    assert str(err.value) == f"private key file not found: {str(missing)!r}"
    with pytest.raises(ValueError, match="private key file not found"):
        keys.load_private_key(tmp_path)


def test_private_key_of_another_algorithm_is_refused(tmp_path):
    key = ec.derive_private_key(12345, ec.SECP256R1())
    path = tmp_path / "ec.key"
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    os.chmod(path, 0o600)
    with pytest.raises(ValueError) as err:
        keys.load_private_key(path)
    assert str(err.value) == f"private key {str(path)!r} is {type(key).__name__}, not Ed25519"


def test_load_public_key_from_file_or_hex(tmp_path):
    pub = tmp_path / "x.pub"
    pub.write_text("\n  " + BOB.public_key.hex() + "  \n\n")
    assert keys.load_public_key(pub) == BOB.public_key
    assert keys.load_public_key(str(pub)) == BOB.public_key
    assert keys.load_public_key(BOB.public_key.hex()) == BOB.public_key
    assert keys.load_public_key(" " + BOB.public_key.hex() + "\n") == BOB.public_key
    with pytest.raises(ValueError, match=r"^public key is not hex: "):
        keys.load_public_key(tmp_path / "missing.pub")  # not a file: read as (bad) hex
    pub.write_text("abcd\n")
    with pytest.raises(ValueError, match=r"^public key must be 32 raw bytes, got 2$"):
        keys.load_public_key(pub)


# ===================================================== allow-list


def test_allow_list_membership_and_lookup():
    allow = AllowList({"robot_1": BOB.public_key.hex(), "robot_0": bytearray(ALICE.public_key)})
    assert len(allow) == 2 and allow.robot_ids == ["robot_0", "robot_1"]
    assert "robot_0" in allow and "robot_2" not in allow and 5 not in allow
    assert allow.public_key("robot_0") == ALICE.public_key and isinstance(
        allow.public_key("robot_0"), bytes
    )
    assert allow.public_key("robot_1") == BOB.public_key
    assert allow.public_key("robot_2") is None
    assert allow.server is None
    assert len(AllowList()) == 0 and AllowList().robot_ids == []


@pytest.mark.parametrize("server", [None, ""])
def test_allow_list_without_server_key(server):
    assert AllowList(server=server).server is None


def test_allow_list_server_key_forms():
    assert AllowList(server=BOB.public_key).server == BOB.public_key
    assert AllowList(server=BOB.public_key.hex()).server == BOB.public_key
    with pytest.raises(ValueError, match=r"^public key must be 32 raw bytes, got 0$"):
        AllowList(server=b"")


def test_allow_list_add_and_remove():
    allow = AllowList()
    allow.add("robot_0", ALICE.public_key)
    allow.add("robot_0", BOB.public_key)  # re-adding rotates the key
    assert allow.public_key("robot_0") == BOB.public_key and len(allow) == 1
    with pytest.raises(ValueError, match="robot id must be a non-empty string"):
        allow.add("", ALICE.public_key)
    with pytest.raises(ValueError, match="robot id longer than 255 bytes"):
        allow.add("r" * 256, ALICE.public_key)
    with pytest.raises(ValueError, match="32 raw bytes"):
        allow.add("robot_1", b"short")
    assert allow.robot_ids == ["robot_0"]
    allow.remove("robot_0")
    assert "robot_0" not in allow and len(allow) == 0
    with pytest.raises(ValueError) as err:
        allow.remove("robot_0")
    assert str(err.value) == "robot 'robot_0' is not on the allow-list"


def test_key_matches_is_exact():
    allow = AllowList({"robot_0": ALICE.public_key})
    assert allow.key_matches("robot_0", ALICE.public_key)
    assert allow.key_matches("robot_0", bytearray(ALICE.public_key))
    assert not allow.key_matches("robot_0", BOB.public_key)
    assert not allow.key_matches("robot_0", ALICE.public_key[:31])
    assert not allow.key_matches("robot_1", ALICE.public_key)  # unknown robot, whatever the key


def test_verify_reject_reasons():
    allow = AllowList({"robot_0": ALICE.public_key})
    sig = ALICE.sign_update(1, "robot_0", NONCE, DIGEST, **HDR)
    assert (
        allow.verify_update("mallory", 1, NONCE, DIGEST, sig, **HDR)
        == "unknown robot 'mallory': no public key on the allow-list"
    )
    assert (
        allow.verify_update("robot_0", 1, NONCE, DIGEST, b"", **HDR)
        == "robot 'robot_0': update is not signed"
    )
    assert (
        allow.verify_update("robot_0", 1, b"short", DIGEST, sig, **HDR)
        == "robot 'robot_0': cannot build signed message: nonce must be 16 bytes, got 5"
    )
    assert (
        allow.verify_update("robot_0", 1, NONCE, DIGEST, sig[:10], **HDR)
        == "robot 'robot_0': bad signature (10 bytes)"
    )
    assert (
        allow.verify_update(
            "robot_0", 1, NONCE, DIGEST, BOB.sign_update(1, "robot_0", NONCE, DIGEST, **HDR), **HDR
        )
        == "robot 'robot_0': bad signature (64 bytes)"
    )
    assert (
        allow.verify_descriptor("mallory", 1, NONCE, DIGEST, sig)
        == "unknown robot 'mallory': no public key on the allow-list"
    )
    assert (
        allow.verify_descriptor("robot_0", 1, NONCE, "zz", sig)
        == "robot 'robot_0': cannot build signed message: descriptor digest is not hex: 'zz'"
    )
    assert (
        allow.verify_descriptor("robot_0", 1, NONCE, DIGEST, b"")
        == "robot 'robot_0': update is not signed"
    )


def test_verify_control():
    body = b"\x01\x02"
    sig = ALICE.sign_control("round", body)
    assert auth.verify_control(ALICE.public_key, "round", body, sig) is None
    assert auth.verify_control(ALICE.public_key, "round", body, bytearray(sig)) is None
    assert (
        auth.verify_control(ALICE.public_key, "round", body, list(sig)) is None
    )  # a ROS uint8[] field
    assert (
        auth.verify_control(None, "round", body, b"") is None
    )  # no server key configured: nothing checked
    assert (
        auth.verify_control(ALICE.public_key, "round", body, b"")
        == "round: not signed by the server"
    )
    assert (
        auth.verify_control(ALICE.public_key, "resend", body, sig)
        == "resend: bad server signature (64 bytes)"
    )
    assert (
        auth.verify_control(ALICE.public_key, "round", body + b"\x00", sig)
        == "round: bad server signature (64 bytes)"
    )
    assert (
        auth.verify_control(BOB.public_key, "round", body, sig)
        == "round: bad server signature (64 bytes)"
    )
    assert (
        auth.verify_control(ALICE.public_key, "round", body, sig[:5])
        == "round: bad server signature (5 bytes)"
    )


def test_allow_list_yaml_exact_file_and_round_trip(tmp_path):
    allow = AllowList(
        {"robot_1": BOB.public_key, "robot_0": ALICE.public_key}, server=BOB.public_key
    )
    path = allow.to_yaml(tmp_path / "sub" / "dir" / "allow.yaml")  # missing parents are created
    assert path == tmp_path / "sub" / "dir" / "allow.yaml"
    assert path.read_text() == (
        "# fed_ros allow-list: robot id -> raw Ed25519 public key (hex).\n"
        f"server: {BOB.public_key.hex()}\n"
        "robots:\n"
        f"  robot_0: {ALICE.public_key.hex()}\n"
        f"  robot_1: {BOB.public_key.hex()}\n"
    )
    assert not (tmp_path / "sub" / "dir" / "allow.yaml.tmp").exists()
    back = AllowList.from_yaml(path)
    assert back.server == BOB.public_key and back.robot_ids == ["robot_0", "robot_1"]
    assert (
        back.public_key("robot_0") == ALICE.public_key
        and back.public_key("robot_1") == BOB.public_key
    )
    # Without a server key the file has no server entry and loads back without one.
    path = AllowList({"robot_0": ALICE.public_key}).to_yaml(tmp_path / "noserver.yaml")
    assert yaml.safe_load(path.read_text()) == {"robots": {"robot_0": ALICE.public_key.hex()}}
    assert AllowList.from_yaml(path).server is None
    # An empty list round-trips too.
    path = AllowList().to_yaml(tmp_path / "empty.yaml")
    assert (
        yaml.safe_load(path.read_text()) == {"robots": {}} and len(AllowList.from_yaml(path)) == 0
    )


@pytest.mark.parametrize(
    "text", ["", "robots:\n", "robots: {}\n", "server: ''\nrobots: null\n", "{}\n"]
)
def test_allow_list_yaml_empty_forms(tmp_path, text):
    path = tmp_path / "a.yaml"
    path.write_text(text)
    allow = AllowList.from_yaml(path)
    assert len(allow) == 0 and allow.server is None


def test_allow_list_yaml_numeric_robot_ids_become_strings(tmp_path):
    path = tmp_path / "a.yaml"
    path.write_text(f"robots:\n  7: {ALICE.public_key.hex()}\n")
    assert AllowList.from_yaml(path).robot_ids == ["7"]


def test_allow_list_yaml_errors_name_the_file_and_entry(tmp_path):
    path = tmp_path / "a.yaml"
    p = repr(str(path))

    def error(text: str) -> str:
        path.write_text(text)
        with pytest.raises(ValueError) as err:
            AllowList.from_yaml(path)
        return str(err.value)

    assert error("- robot_0\n") == f"allow-list {p} must be a mapping, got list"
    assert error("just text\n") == f"allow-list {p} must be a mapping, got str"
    assert (
        error("zeta: 1\nalpha: 2\nrobots: {}\n")
        == f"allow-list {p}: unknown keys ['alpha', 'zeta']"
    )
    assert error("robots: [robot_0]\n") == f"allow-list {p}: 'robots' must map robot id -> hex key"
    assert (
        error("robots:\n  robot_1: abcd\n")
        == f"allow-list {p}, robot 'robot_1': public key must be 32 raw bytes, got 2"
    )
    assert (
        error("robots:\n  robot_1: xyz\n")
        == f"allow-list {p}, robot 'robot_1': public key is not hex: 'xyz'"
    )
    missing = tmp_path / "missing.yaml"
    with pytest.raises(ValueError) as err:
        AllowList.from_yaml(missing)
    assert str(err.value) == f"allow-list file not found: {str(missing)!r}"
    with pytest.raises(ValueError, match="allow-list file not found"):
        AllowList.from_yaml(tmp_path)  # a directory is not a file


# ===================================================== fed-ros keys


def test_keys_generate_reports_and_writes(tmp_path, capsys):
    out = tmp_path / "keys"
    assert keys_main(["generate", "robot_b", "robot_a", "--server", "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    allow = AllowList.from_yaml(out / "allow_list.yaml")
    assert allow.robot_ids == ["robot_a", "robot_b"] and "server" not in allow
    server_pub = keys.load_public_key(out / "server.pub")
    assert allow.server == server_pub == Signer.from_file(out / "server.key").public_key
    for name in ("robot_b", "robot_a"):
        assert allow.public_key(name) == Signer.from_file(out / f"{name}.key").public_key
    assert lines == [
        f"created  {out / 'robot_b.key'}  public {allow.public_key('robot_b').hex()}",
        f"created  {out / 'robot_a.key'}  public {allow.public_key('robot_a').hex()}",
        f"created  {out / 'server.key'}  public {server_pub.hex()}",
        f"allow-list {out / 'allow_list.yaml'}: 2 robots, server key",
    ]


def test_keys_generate_names_and_num_robots_add_up(tmp_path):
    out = tmp_path / "keys"
    assert keys_main(["generate", "arm_x", "--num-robots", "2", "--out", str(out)]) == 0
    assert AllowList.from_yaml(out / "allow_list.yaml").robot_ids == ["arm_x", "robot_0", "robot_1"]
    assert sorted(p.name for p in out.glob("*.key")) == ["arm_x.key", "robot_0.key", "robot_1.key"]


def test_keys_generate_keeps_or_forces(tmp_path, capsys):
    out = tmp_path / "keys"
    assert keys_main(["generate", "--num-robots", "2", "--out", str(out)]) == 0
    first = keys.load_public_key(out / "robot_0.pub")
    capsys.readouterr()
    assert keys_main(["generate", "robot_0", "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        f"kept     {out / 'robot_0.key'}  public {first.hex()}",
        f"allow-list {out / 'allow_list.yaml'}: 2 robots",
    ]
    assert keys_main(["generate", "robot_0", "--force", "--out", str(out)]) == 0
    assert capsys.readouterr().out.startswith("created  ")
    rotated = keys.load_public_key(out / "robot_0.pub")
    assert rotated != first
    assert AllowList.from_yaml(out / "allow_list.yaml").public_key("robot_0") == rotated


def test_keys_generate_with_explicit_allow_list(tmp_path, capsys):
    out, allow_path = tmp_path / "keys", tmp_path / "other" / "fleet.yaml"
    AllowList({"robot_9": BOB.public_key}).to_yaml(allow_path)
    assert (
        keys_main(["generate", "robot_0", "--out", str(out), "--allow-list", str(allow_path)]) == 0
    )
    assert not (out / "allow_list.yaml").exists()
    allow = AllowList.from_yaml(allow_path)
    assert allow.robot_ids == ["robot_0", "robot_9"]  # the existing list is extended, not replaced
    assert capsys.readouterr().out.splitlines()[-1] == f"allow-list {allow_path}: 2 robots"


def test_keys_generate_needs_names(tmp_path, capsys):
    assert keys_main(["generate", "--out", str(tmp_path)]) == 2
    assert (
        capsys.readouterr().err
        == "fed-ros keys generate: give robot names, --num-robots N or --server\n"
    )
    assert list(tmp_path.iterdir()) == []


def test_keys_generate_refuses_bad_names_and_bad_files(tmp_path, capsys):
    assert keys_main(["generate", "r" * 256, "--out", str(tmp_path)]) == 1
    assert capsys.readouterr().err.startswith("fed-ros keys: robot id longer than 255 bytes")
    key = ALICE.save(tmp_path / "robot_0.key")
    os.chmod(key, 0o644)
    assert keys_main(["generate", "robot_0", "--out", str(tmp_path)]) == 1
    assert f"(chmod 600 {key})" in capsys.readouterr().err


def test_keys_allow_revoke_and_list(tmp_path, capsys):
    path = tmp_path / "allow.yaml"
    pub = tmp_path / "bob.pub"
    pub.write_text(BOB.public_key.hex() + "\n")
    assert (
        keys_main(["allow", "arm_7", str(pub), "--allow-list", str(path)]) == 0
    )  # creates the list
    assert capsys.readouterr().out == f"allowed arm_7 ({BOB.public_key.hex()}) in {path}\n"
    assert keys_main(["allow", "server", ALICE.public_key.hex(), "--allow-list", str(path)]) == 0
    capsys.readouterr()
    allow = AllowList.from_yaml(path)
    assert allow.server == ALICE.public_key and allow.robot_ids == ["arm_7"]
    assert keys_main(["list", "--allow-list", str(path)]) == 0
    assert (
        capsys.readouterr().out
        == f"server     {ALICE.public_key.hex()}\narm_7      {BOB.public_key.hex()}\n"
    )
    assert keys_main(["revoke", "arm_7", "--allow-list", str(path)]) == 0
    assert capsys.readouterr().out == f"revoked arm_7 in {path}\n"
    assert len(AllowList.from_yaml(path)) == 0
    assert keys_main(["revoke", "arm_7", "--allow-list", str(path)]) == 1
    assert capsys.readouterr().err == "fed-ros keys: robot 'arm_7' is not on the allow-list\n"
    assert keys_main(["list", "--allow-list", str(tmp_path / "none.yaml")]) == 1
    assert "allow-list file not found" in capsys.readouterr().err


def test_keys_list_without_server(tmp_path, capsys):
    path = AllowList({"robot_10": BOB.public_key, "r2": ALICE.public_key}).to_yaml(
        tmp_path / "a.yaml"
    )
    assert keys_main(["list", "--allow-list", str(path)]) == 0
    assert (
        capsys.readouterr().out
        == f"r2         {ALICE.public_key.hex()}\nrobot_10   {BOB.public_key.hex()}\n"
    )


def test_keys_requires_an_action(capsys):
    with pytest.raises(SystemExit) as exc:
        keys_main([])
    assert exc.value.code == 2
    assert capsys.readouterr().err.endswith(
        "fed-ros keys: error: the following arguments are required: action\n"
    )


# ===================================================== replay guard


def test_replay_guard_defaults_window_one_round():
    guard = ReplayGuard()
    assert guard.window_rounds == 1 and guard.floor == 0
    guard.advance(10)
    assert guard.floor == 10
    assert "older than the oldest open round 10" in guard.check("r", 9, NONCE)
    assert guard.check("r", 10, NONCE) is None


def test_replay_guard_default_capacity_is_100000_nonces():
    guard = ReplayGuard()
    assert guard.max_nonces == 100_000
    for i in range(100_000):
        guard.record("r", 0, i.to_bytes(16, "big"))
    assert len(guard) == 100_000 and guard.floor == 0  # full, nothing evicted
    guard.record("r", 0, (100_000).to_bytes(16, "big"))
    assert len(guard) == 100_000 and guard.floor == 1  # one evicted, its round closed


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(max_nonces=0), "max_nonces must be >= 1, got 0"),
        (dict(window_rounds=0), "window_rounds must be >= 1, got 0"),
    ],
)
def test_replay_guard_settings_errors(kw, message):
    with pytest.raises(ValueError) as err:
        ReplayGuard(**kw)
    assert str(err.value) == message


def test_replay_guard_smallest_settings_work():
    guard = ReplayGuard(max_nonces=1, window_rounds=1)
    guard.record("r", 4, b"a" * 16)
    assert len(guard) == 1 and guard.floor == 0
    guard.record("r", 4, b"b" * 16)
    assert len(guard) == 1 and guard.floor == 5  # 'a' evicted: its round 4 is closed


@pytest.mark.parametrize("window", [1, 2, 5])
def test_replay_guard_window_exact_edge(window):
    guard = ReplayGuard(window_rounds=window)
    guard.advance(20)
    first_open = 20 - window + 1
    assert guard.floor == first_open
    assert guard.check("r", first_open, NONCE) is None
    assert (
        guard.check("r", first_open - 1, NONCE)
        == f"robot 'r': round {first_open - 1} is older than the oldest open round {first_open}"
    )


def test_replay_guard_floor_never_goes_down():
    guard = ReplayGuard(window_rounds=2)
    guard.advance(10)
    guard.record("r", 9, b"a" * 16)
    guard.advance(3)  # a stale / out-of-order advance
    assert guard.floor == 9 and len(guard) == 1
    guard.advance(0)
    assert guard.floor == 9


def test_replay_guard_advance_forgets_exactly_the_closed_rounds():
    guard = ReplayGuard(window_rounds=2)
    for rnd, byte in ((3, b"a"), (4, b"b"), (5, b"c"), (4, b"d")):
        guard.record("r", rnd, byte * 16)
    guard.advance(5)  # floor 4: round 3 closed
    assert guard.floor == 4 and len(guard) == 3
    assert guard.state()["nonces"] == [
        [("b" * 16).encode().hex(), 4],
        [("c" * 16).encode().hex(), 5],
        [("d" * 16).encode().hex(), 4],
    ]
    assert "already used (replay)" in guard.check("r", 4, b"b" * 16)
    guard.advance(5)  # same round again: no change
    assert guard.floor == 4 and len(guard) == 3
    guard.advance(6)  # floor 5: the two round-4 nonces go, round 5 stays
    assert guard.floor == 5 and guard.state()["nonces"] == [[("c" * 16).encode().hex(), 5]]


def test_replay_guard_check_reasons_and_purity():
    guard = ReplayGuard()
    guard.record("r", 0, NONCE)
    assert (
        guard.check("robot_0", 0, NONCE)
        == f"robot 'robot_0': nonce {NONCE.hex()} already used (replay)"
    )
    assert guard.check("robot_0", 0, bytearray(NONCE)) is not None
    assert guard.check("robot_0", 0, b"x" * 15) == "robot 'robot_0': nonce must be 16 bytes, got 15"
    assert guard.check("robot_0", 0, b"x" * 17) == "robot 'robot_0': nonce must be 16 bytes, got 17"
    fresh = b"f" * 16
    assert guard.check("robot_0", 0, fresh) is None
    assert guard.check("robot_0", 0, fresh) is None  # check records nothing
    assert len(guard) == 1


def test_replay_guard_evicts_oldest_first_and_raises_floor_monotonically():
    guard = ReplayGuard(max_nonces=2)
    guard.record("r", 7, b"a" * 16)
    guard.record("r", 3, b"b" * 16)
    guard.record("r", 5, b"c" * 16)  # evicts 'a' (oldest recorded), floor -> 8
    assert guard.floor == 8 and len(guard) == 2
    assert guard.check("r", 8, b"a" * 16) is None  # evicted, but its round 7 is closed for good
    assert "older than" in guard.check("r", 7, b"a" * 16)
    guard.record("r", 9, b"d" * 16)  # evicts 'b' of round 3: the floor stays at 8, never drops to 4
    assert guard.floor == 8
    assert [n for n, _ in guard.state()["nonces"]] == [
        ("c" * 16).encode().hex(),
        ("d" * 16).encode().hex(),
    ]


def test_replay_guard_record_stores_bytes_and_int_rounds():
    guard = ReplayGuard()
    guard.record("r", np.int64(4), bytearray(NONCE))
    assert guard.state() == {"floor": 0, "nonces": [[NONCE.hex(), 4]]}
    assert type(guard.state()["nonces"][0][1]) is int
    assert "already used" in guard.check("r", 4, NONCE)


def test_replay_guard_state_round_trip_preserves_order(tmp_path):
    import json

    guard = ReplayGuard(max_nonces=3, window_rounds=2)
    guard.advance(4)
    for rnd, byte in ((3, b"a"), (4, b"b"), (3, b"c")):
        guard.record("r", rnd, byte * 16)
    state = json.loads(json.dumps(guard.state()))  # what a server persists
    assert state == {
        "floor": 3,
        "nonces": [[(b"a" * 16).hex(), 3], [(b"b" * 16).hex(), 4], [(b"c" * 16).hex(), 3]],
    }
    clone = ReplayGuard(max_nonces=3, window_rounds=2)
    clone.load_state(state)
    assert clone.state() == state and clone.floor == 3 and len(clone) == 3
    for byte in (b"a", b"b", b"c"):
        assert "already used" in clone.check("r", 4, byte * 16)
    # Eviction order survives the round trip: the next record evicts 'a', as in the original.
    clone.record("r", 4, b"d" * 16)
    guard.record("r", 4, b"d" * 16)
    assert clone.state() == guard.state()
    assert [n for n, _ in clone.state()["nonces"]][0] == (b"b" * 16).hex()
    # Loading replaces the whole state.
    clone.load_state({"floor": 0, "nonces": []})
    assert clone.floor == 0 and len(clone) == 0


@pytest.mark.parametrize(
    "state",
    [
        {},
        {"floor": 1},
        {"nonces": []},
        {"floor": "x", "nonces": []},
        {"floor": None, "nonces": []},
        {"floor": 1, "nonces": 5},
        {"floor": 1, "nonces": [["zz", 1]]},
        {"floor": 1, "nonces": [["00", "r"]]},
        {"floor": 1, "nonces": [["00", 1, 2]]},
        {"floor": 1, "nonces": [None]},
    ],
)
def test_replay_guard_bad_state_is_refused_and_changes_nothing(state):
    guard = ReplayGuard()
    guard.advance(2)
    guard.record("r", 2, NONCE)
    before = guard.state()
    with pytest.raises(ValueError, match=r"^bad replay-guard state: "):
        guard.load_state(state)
    assert guard.state() == before


def test_replay_guard_on_change_runs_after_each_change_only():
    seen = []
    guard = ReplayGuard(max_nonces=2, on_change=lambda g: seen.append(g.state()))
    guard.advance(0)  # the floor stays 0: nothing changed
    assert seen == []
    guard.record("r", 0, b"a" * 16)
    assert seen == [{"floor": 0, "nonces": [[(b"a" * 16).hex(), 0]]}]
    guard.advance(1)  # the floor rises and round 0's nonce goes
    assert seen[-1] == {"floor": 1, "nonces": []} and len(seen) == 2
    guard.advance(1)
    assert len(seen) == 2
    guard.check("r", 1, b"b" * 16)  # a check changes nothing
    assert len(seen) == 2


def test_persistent_guard_survives_a_restart_and_refuses_a_bad_file(tmp_path):
    import json

    from fed_ros.core.security.replay_file import GUARD_FILE, persistent_guard

    state_dir = tmp_path / "run" / "state"  # created with its parents on first use
    guard = persistent_guard(state_dir, window_rounds=2)
    assert guard.window_rounds == 2 and not (state_dir / GUARD_FILE).exists()
    guard.advance(3)
    guard.record("r", 3, b"a" * 16)
    on_disk = json.loads((state_dir / GUARD_FILE).read_text())
    assert on_disk == guard.state() == {"floor": 2, "nonces": [[(b"a" * 16).hex(), 3]]}
    assert not (state_dir / (GUARD_FILE + ".tmp")).exists()
    restarted = persistent_guard(state_dir, window_rounds=2)  # the server after a restart
    assert restarted.state() == guard.state()
    assert restarted.check("r", 3, b"a" * 16) == (
        f"robot 'r': nonce {(b'a' * 16).hex()} already used (replay)"
    )
    restarted.record("r", 3, b"b" * 16)  # the restarted guard keeps saving
    assert len(json.loads((state_dir / GUARD_FILE).read_text())["nonces"]) == 2
    for bad in ("not json", '{"floor": 1}', "[1, 2]", '{"floor": 1, "nonces": [["zz", 1]]}'):
        (state_dir / GUARD_FILE).write_text(bad)
        with pytest.raises(ValueError) as err:
            persistent_guard(state_dir)
        assert str(err.value).startswith(
            f"replay guard file {state_dir / GUARD_FILE} is unreadable: "
        )


# ===================================================== regressions (bugs found here)


@pytest.mark.parametrize(
    "content, why",
    [
        (b"junk", "Unable to load PEM file"),
        (
            Ed25519PrivateKey.from_private_bytes(bytes([1]) * 32).private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.BestAvailableEncryption(b"passphrase"),
            ),
            "encrypted",
        ),
    ],
)
def test_unloadable_private_key_is_a_value_error_naming_the_path(tmp_path, capsys, content, why):
    """Was: a passphrase-encrypted key raised TypeError (a traceback out of `fed-ros keys`), a
    corrupt one a ValueError that did not say which file."""
    path = tmp_path / "robot_0.key"
    path.write_bytes(content)
    os.chmod(path, 0o600)
    with pytest.raises(ValueError) as err:
        keys.load_private_key(path)
    assert str(err.value).startswith(
        f"private key {str(path)!r} cannot be loaded: "
    ) and why in str(err.value)
    assert keys_main(["generate", "robot_0", "--out", str(tmp_path)]) == 1
    assert capsys.readouterr().err.startswith(
        f"fed-ros keys: private key {str(path)!r} cannot be loaded: "
    )


@pytest.mark.parametrize(
    "server, why",
    [("abcd", "public key must be 32 raw bytes, got 2"), ("xyz", "public key is not hex: 'xyz'")],
)
def test_allow_list_bad_server_key_names_the_file(tmp_path, server, why):
    """Was: a bad `server:` entry raised the bare key error, naming neither the file nor the
    entry."""
    path = tmp_path / "a.yaml"
    path.write_text(f"server: {server}\nrobots: {{}}\n")
    with pytest.raises(ValueError) as err:
        AllowList.from_yaml(path)
    assert str(err.value) == f"allow-list {str(path)!r}, server: {why}"


# ===================================================== fed-ros keys: what --help tells the operator


def help_text(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        keys_main([*argv, "--help"])
    assert exc.value.code == 0
    return " ".join(capsys.readouterr().out.split())  # argparse wraps to the terminal width


def test_keys_help_lists_the_actions(capsys):
    text = help_text([], capsys)
    assert text.startswith("usage: fed-ros keys [-h] {generate,allow,revoke,list} ...")
    assert (
        "`fed-ros keys`: create key pairs (0600 private keys) and manage the allow-list YAML."
        in text
    )
    for line in (
        "generate create key pairs and add them to an allow-list",
        "allow add a public key (hex or .pub file) to an allow-list",
        "revoke remove a robot from an allow-list",
        "list print an allow-list",
    ):
        assert line in text


def test_keys_generate_help_documents_options_and_defaults(capsys):
    text = help_text(["generate"], capsys)
    assert text.startswith("usage: fed-ros keys generate [-h]")
    for line in (
        "names robot ids (e.g. robot_0 robot_1)",
        "--num-robots NUM_ROBOTS also create robot_0..robot_{N-1}",
        "--server also create the server key pair",
        "--out OUT directory for <name>.key / <name>.pub (default: keys)",
        "--allow-list ALLOW_LIST allow-list YAML (default: <out>/allow_list.yaml)",
        "--force replace existing key files",
    ):
        assert line in text


def test_keys_allow_help(capsys):
    assert "key 64 hex chars or a .pub file" in help_text(["allow"], capsys)


@pytest.mark.parametrize("action", [["allow", "r", "00"], ["revoke", "r"], ["list"]])
def test_keys_allow_list_option_is_required(action, capsys):
    with pytest.raises(SystemExit) as exc:
        keys_main(action)
    assert exc.value.code == 2
    assert "the following arguments are required: --allow-list" in capsys.readouterr().err


def test_keys_generate_defaults_to_a_keys_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert keys_main(["generate", "robot_0"]) == 0
    assert sorted(p.name for p in (tmp_path / "keys").iterdir()) == [
        "allow_list.yaml",
        "robot_0.key",
        "robot_0.pub",
    ]
    assert capsys.readouterr().out.splitlines()[-1] == "allow-list keys/allow_list.yaml: 1 robots"


def test_keys_main_reads_sys_argv_by_default(tmp_path, monkeypatch, capsys):
    path = AllowList({"robot_0": ALICE.public_key}).to_yaml(tmp_path / "a.yaml")
    monkeypatch.setattr("sys.argv", ["fed-ros-keys", "list", "--allow-list", str(path)])
    assert keys_main() == 0
    assert capsys.readouterr().out == f"robot_0    {ALICE.public_key.hex()}\n"


@pytest.mark.parametrize("cluster_id", [2**31, -(2**31) - 1, True])
def test_update_message_cluster_id_error_names_the_field(cluster_id):
    with pytest.raises(ValueError, match=rf"^cluster id must be an int32, got {cluster_id!r}$"):
        signed_messages.update_message(
            1, "r", NONCE, DIGEST, base_round=0, num_samples=0, cluster_id=cluster_id
        )
