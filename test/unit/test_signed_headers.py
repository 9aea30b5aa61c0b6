"""Issue 13: signatures cover everything that steers a receiver (ROS-free).

The update signature covers the whole payload header through ``signed_messages.transfer_digest``
(payload id, manifest, int8 scales, chunk count and per-chunk SHA-256 list, bulk address); the
server's cluster-model signature covers the header and the member robots; control messages (round
announcements, resend requests) carry a server signature over their own bytes. The robot-side
check ``validation.validate_cluster_model`` is exercised with a real server key and a fake server.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from fed_ros.core.security import auth
from fed_ros.core.security import replay
from fed_ros.core.security import signed_messages
from fed_ros.core.checks.decisions import BAD_SIGNATURE, UNSIGNED
from fed_ros.core.checks.payload_checks import validate_cluster_model
from fed_ros.core.checks.sender_checks import ValidationContext
from fed_ros.core.checks.update_checks import UpdateEnvelope, check_update_envelope
from fed_ros.core.security.auth import AllowList, Signer

HDR = dict(base_round=2, num_samples=100, cluster_id=-1)
MANIFEST = [("enc.weight", (4, 3), "float32"), ("enc.bias", (4,), "float32")]
CHUNKS = [b"a" * 40, b"b" * 24]


def transfer(**change) -> bytes:
    fields = dict(
        payload_id="robot_0/r2/update/00ff",
        encoding=0,
        total_bytes=64,
        chunk_count=2,
        manifest=MANIFEST,
        scales=b"",
        chunk_sha256=b"".join(hashlib.sha256(c).digest() for c in CHUNKS),
        bulk_uri="",
    )
    fields.update(change)
    return signed_messages.transfer_digest(**fields)


@pytest.fixture(scope="module")
def robot() -> Signer:
    return Signer.generate()


@pytest.fixture(scope="module")
def server() -> Signer:
    return Signer.generate()


def test_transfer_digest_changes_with_every_header_field():
    base = transfer()
    changes = {
        "payload_id": "robot_0/r2/update/00fe",
        "encoding": 1,
        "total_bytes": 65,
        "chunk_count": 3,
        "manifest": [MANIFEST[1], MANIFEST[0]],
        "scales": b"\x00\x00\x80?",
        "chunk_sha256": hashlib.sha256(b"x").digest() * 2,
        "bulk_uri": "tcp://10.0.0.9:5555/abc",
    }
    digests = {name: transfer(**{name: value}) for name, value in changes.items()}
    assert all(d != base for d in digests.values()), [n for n, d in digests.items() if d == base]
    assert len(set(digests.values())) == len(digests)
    # Renaming a tensor (same shapes, same bytes) changes what the bytes mean: signed too.
    assert transfer(manifest=[("enc.w", (4, 3), "float32"), MANIFEST[1]]) != base
    with pytest.raises(ValueError, match="32 bytes per chunk"):
        transfer(chunk_sha256=b"\x00" * 33)


def test_update_signature_covers_the_transfer_header(robot):
    nonce, digest = signed_messages.new_nonce(), signed_messages.sha256_hex(b"payload")
    allow = AllowList({"robot_0": robot.public_key})
    sig = robot.sign_update(2, "robot_0", nonce, digest, transfer=transfer(), **HDR)
    assert allow.verify_update("robot_0", 2, nonce, digest, sig, transfer=transfer(), **HDR) is None
    # Another bulk endpoint, another chunk list, another payload id: the signature no longer holds.
    for change in (
        {"bulk_uri": "tcp://evil:1/x"},
        {"chunk_sha256": hashlib.sha256(b"x").digest() * 2},
        {"payload_id": "robot_0/r2/update/dead"},
    ):
        assert "bad signature" in allow.verify_update(
            "robot_0", 2, nonce, digest, sig, transfer=transfer(**change), **HDR
        )
    assert "bad signature" in allow.verify_update(
        "robot_0", 2, nonce, digest, sig, **HDR
    )  # header left out


def test_update_envelope_signature_checks_the_transfer_digest(robot):
    allow = AllowList({"robot_0": robot.public_key})
    env = UpdateEnvelope(
        robot_id="robot_0",
        round_idx=2,
        base_round=2,
        num_samples=100,
        manifest=MANIFEST,
        total_bytes=64,
        payload_sha256=signed_messages.sha256_hex(b"p"),
        nonce=signed_messages.new_nonce(),
        transfer=transfer(),
    ).signed(robot)
    ctx = ValidationContext(
        current_round=2,
        base_rounds={2},
        participants={"robot_0"},
        allow_list=allow,
        replay_guard=replay.ReplayGuard(),
    )
    assert check_update_envelope(env, ctx)
    import dataclasses

    moved = dataclasses.replace(env, transfer=transfer(bulk_uri="tcp://attacker:5555/token"))
    d = check_update_envelope(moved, ctx)
    assert not d and d.code == BAD_SIGNATURE, d


def _model(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"w": rng.normal(size=(4, 3)).astype(np.float32), "b": np.zeros(4, np.float32)}


def test_robot_accepts_a_cluster_model_signed_by_its_server(server):
    sha = signed_messages.sha256_hex(b"model bytes")
    sig = server.sign_cluster_model(3, 0, sha, transfer=transfer(), members=["robot_0", "robot_1"])
    d = validate_cluster_model(
        cluster_id=0,
        round_idx=3,
        params=_model(),
        expected_manifest=None,
        total_bytes=64,
        payload_sha256=sha,
        received_sha256=sha,
        signature=sig,
        server_public_key=server.public_key,
        transfer=transfer(),
        members=["robot_0", "robot_1"],
    )
    assert d, d.reason


@pytest.mark.parametrize(
    "case", ["unsigned", "fake_server", "members", "round", "cluster", "transfer", "flipped"]
)
def test_robot_refuses_a_cluster_model_its_server_did_not_sign(server, case):
    sha = signed_messages.sha256_hex(b"model bytes")
    signer = Signer.generate() if case == "fake_server" else server
    sig = signer.sign_cluster_model(3, 0, sha, transfer=transfer(), members=["robot_0"])
    got = dict(cluster_id=0, round_idx=3, transfer=transfer(), members=["robot_0"], signature=sig)
    if case == "unsigned":
        got["signature"] = b""
    elif case == "members":
        got["members"] = ["robot_0", "intruder"]  # re-routes the model to another robot
    elif case == "round":
        got["round_idx"] = 4
    elif case == "cluster":
        got["cluster_id"] = 1
    elif case == "transfer":
        got["transfer"] = transfer(bulk_uri="tcp://attacker:5555/x")
    elif case == "flipped":
        got["signature"] = bytes([sig[0] ^ 1]) + sig[1:]
    d = validate_cluster_model(
        params=_model(),
        expected_manifest=None,
        total_bytes=64,
        payload_sha256=sha,
        received_sha256=sha,
        server_public_key=server.public_key,
        **got,
    )
    assert not d
    assert d.code == (UNSIGNED if case == "unsigned" else BAD_SIGNATURE), d
    assert "server signature" in d.reason or "not signed by the server" in d.reason


def test_without_a_server_key_the_robot_does_not_check_signatures():
    """What running without a server key means: any well-formed model is taken (documented)."""
    sha = signed_messages.sha256_hex(b"m")
    assert validate_cluster_model(
        cluster_id=0,
        round_idx=0,
        params=_model(),
        expected_manifest=None,
        payload_sha256=sha,
        received_sha256=sha,
        signature=b"",
    )


def test_control_messages_verify_only_with_the_server_key_and_their_kind(server):
    body = b"\x00\x01announcement-cdr"
    sig = server.sign_control("round", body)
    assert auth.verify_control(server.public_key, "round", body, sig) is None
    assert "bad server signature" in auth.verify_control(
        server.public_key, "round", body + b"x", sig
    )
    assert "bad server signature" in auth.verify_control(
        server.public_key, "update_resend", body, sig
    )
    assert "bad server signature" in auth.verify_control(
        Signer.generate().public_key, "round", body, sig
    )
    assert "not signed by the server" in auth.verify_control(server.public_key, "round", body, b"")
    assert (
        auth.verify_control(None, "round", body, b"") is None
    )  # no key configured: nothing checked
    # Domain separation: a control signature is not a cluster-model signature.
    assert auth.verify_control(server.public_key, "round", body, server.sign(body)) is not None
