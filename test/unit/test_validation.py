"""V1-V5 input validation, L5 late/replayed updates, S3 authenticity and P4 audit log."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from fed_ros.core.security import signed_messages
from fed_ros.core.checks.audit_log import AuditLog, read_audit_log
from fed_ros.core.checks.decisions import (
    ACCEPTED,
    BAD_SIGNATURE,
    DIGEST,
    Decision,
    FUTURE,
    LATE,
    Limits,
    NON_FINITE,
    NOT_PARTICIPANT,
    NUM_SAMPLES,
    OK,
    OUT_OF_RANGE,
    OVERSIZE,
    REPLAY,
    ROLLBACK,
    SCHEMA,
    SIZE_MISMATCH,
    STALE_BASE,
    UNKNOWN_ROBOT,
    UNSIGNED,
)
from fed_ros.core.checks.descriptor_checks import digest_of_descriptor, validate_descriptor
from fed_ros.core.checks.payload_checks import validate_cluster_model
from fed_ros.core.checks.sender_checks import ValidationContext
from fed_ros.core.checks.update_checks import UpdateEnvelope, check_update_envelope, validate_update
from fed_ros.core.security.auth import AllowList, Signer
from fed_ros.core.security.replay import ReplayGuard
from fed_ros.core.params import TensorSpec, manifest_of
from fed_ros.core.strategies.types import ClientDescriptor

MANIFEST = (
    TensorSpec("enc.weight", (8, 4)),
    TensorSpec("enc.bias", (8,)),
    TensorSpec("head.weight", (4, 8)),
)
SIGNERS = {f"robot_{i}": Signer.generate() for i in range(3)}


def make_params(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {s.name: rng.normal(size=s.shape).astype(np.float32) for s in MANIFEST}


def payload_of(params) -> bytes:
    return b"".join(np.ascontiguousarray(a, "<f4").tobytes() for a in params.values())


def signed_envelope(params, robot_id="robot_0", round_idx=5, base_round=4, nonce=None, **over):
    payload = payload_of(params)
    digest = signed_messages.sha256_hex(payload)
    nonce = signed_messages.new_nonce() if nonce is None else nonce
    fields = dict(
        robot_id=robot_id,
        round_idx=round_idx,
        base_round=base_round,
        num_samples=100,
        manifest=manifest_of(params),
        total_bytes=len(payload),
        payload_sha256=digest,
        nonce=nonce,
    )
    signature = over.pop("signature", None)
    fields.update(over)
    env = UpdateEnvelope(**fields)
    if signature is not None:
        return dataclasses.replace(env, signature=signature)
    signer = SIGNERS.get(robot_id, Signer.generate())  # unknown robots sign with their own key
    return env.signed(signer) if isinstance(robot_id, str) and robot_id else env


@pytest.fixture
def ctx() -> ValidationContext:
    guard = ReplayGuard()
    guard.advance(5)
    return ValidationContext(
        current_round=5,
        expected_manifest=MANIFEST,
        base_rounds={4},
        participants=set(SIGNERS),
        limits=Limits(max_update_bytes=4096, max_num_samples=10_000),
        allow_list=AllowList({rid: s.public_key for rid, s in SIGNERS.items()}),
        replay_guard=guard,
    )


def test_valid_update_accepted(ctx):
    params = make_params()
    env = signed_envelope(params)
    d = validate_update(
        env, params, ctx, received_sha256=signed_messages.sha256_hex(payload_of(params))
    )
    assert d.accepted and d.code == OK and bool(d)


def test_v1_oversize_rejected_before_decoding_then_next_valid_accepted(ctx):
    """V1: the cap is checked on the envelope (first chunk) -> nothing is collected or decoded."""
    huge = signed_envelope(make_params(), total_bytes=10 * 2**30)
    d = check_update_envelope(huge, ctx)
    assert not d and d.code == OVERSIZE
    assert "10737418240 bytes exceeds the cap 4096 bytes" in d.reason
    # A lying size (not what the manifest implies) is refused too.
    d = check_update_envelope(signed_envelope(make_params(), total_bytes=100), ctx)
    assert d.code == SIZE_MISMATCH and "total_bytes 100 != 288" in d.reason
    params = make_params(1)
    assert validate_update(signed_envelope(params), params, ctx)


@pytest.mark.parametrize(
    "mutate, code, needle",
    [
        (
            lambda p: {k: v for k, v in list(p.items())[:2]},
            SCHEMA,
            "update has 2 tensors, expected 3",
        ),
        (
            lambda p: {**p, "enc.bias": np.zeros(9, np.float32)},
            SCHEMA,
            "'enc.bias' has shape (9,), expected (8,)",
        ),
        (lambda p: {**p, "enc.bias": p["enc.bias"].astype(np.float64)}, SCHEMA, "dtype float64"),
        (lambda p: dict(reversed(list(p.items()))), SCHEMA, "at position 0, expected 'enc.weight'"),
        (
            lambda p: {("x" if k == "enc.bias" else k): v for k, v in p.items()},
            SCHEMA,
            "'x' at position 1",
        ),
    ],
)
def test_v2_schema_mismatch_rejected(ctx, mutate, code, needle):
    good = make_params()
    env = signed_envelope(good)
    d = validate_update(env, mutate(good), ctx)
    assert d.code == code and needle in d.reason, d


def test_v2_announced_manifest_checked_on_envelope(ctx):
    params = make_params()
    wrong = (TensorSpec("enc.weight", (4, 8)),) + MANIFEST[1:]
    d = check_update_envelope(signed_envelope(params, manifest=wrong), ctx)
    assert d.code == SCHEMA and "'enc.weight' has shape (4, 8), expected (8, 4)" in d.reason
    tuples = [(s.name, list(s.shape), "float16") for s in MANIFEST]
    d = check_update_envelope(signed_envelope(params, manifest=tuples), ctx)
    assert d.code == SCHEMA and "dtype 'float16'" in d.reason


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_v3_any_non_finite_value_rejects_whole_update(ctx, bad):
    params = make_params()
    params["head.weight"][3, 7] = bad
    d = validate_update(signed_envelope(params), params, ctx)
    assert d.code == NON_FINITE and "'head.weight' has 1 NaN/Inf" in d.reason
    assert len(ctx.replay_guard) == 0  # a rejected update leaves no trace in the guard


def test_out_of_range_values_rejected(ctx):
    params = make_params()
    params["enc.bias"][0] = 1e9
    d = validate_update(signed_envelope(params), params, ctx)
    assert d.code == OUT_OF_RANGE and "1e+09" in d.reason


@pytest.mark.parametrize(
    "n, needle",
    [(0, "must be >= 1"), (10_001, "exceeds the cap 10000"), (2**63, "exceeds the cap")],
)
def test_v5_sample_count_capped(ctx, n, needle):
    params = make_params()
    d = validate_update(signed_envelope(params, num_samples=n), params, ctx)
    assert d.code == NUM_SAMPLES and needle in d.reason


def test_l5_late_future_stale_and_after_deadline(ctx):
    params = make_params()
    d = validate_update(signed_envelope(params, round_idx=4, base_round=3), params, ctx)
    assert d.code == LATE and "round 4 is over (current round 5)" in d.reason
    d = validate_update(signed_envelope(params, round_idx=6), params, ctx)
    assert d.code == FUTURE
    d = validate_update(signed_envelope(params, base_round=2), params, ctx)
    assert d.code == STALE_BASE and "model version 2, expected one of [4]" in d.reason
    late_ctx = dataclasses.replace(ctx, deadline_passed=True)
    d = validate_update(signed_envelope(params), params, late_ctx)
    assert d.code == LATE and "after the deadline" in d.reason


def test_l5_replayed_update_rejected(ctx):
    params = make_params()
    env = signed_envelope(params)
    assert validate_update(env, params, ctx)
    d = validate_update(env, params, ctx)  # byte-identical replay, valid signature
    assert d.code == REPLAY and "already used (replay)" in d.reason
    # The same update replayed in a later round is refused as late before the nonce is even looked
    # at.
    ctx.current_round = 6
    ctx.replay_guard.advance(6)
    assert validate_update(env, params, ctx).code == LATE


def test_s3_forged_unknown_unsigned_rejected(ctx):
    params = make_params()
    mallory = Signer.generate()
    env = signed_envelope(params)
    forged = env.signed(mallory)
    d = validate_update(forged, params, ctx)
    assert d.code == BAD_SIGNATURE and "robot 'robot_0': bad signature" in d.reason
    ctx.participants = None
    d = validate_update(signed_envelope(params, robot_id="mallory"), params, ctx)
    assert d.code == UNKNOWN_ROBOT and "'mallory'" in d.reason
    d = validate_update(dataclasses.replace(env, signature=b""), params, ctx)
    assert d.code == UNSIGNED
    # A genuine update re-weighted in transit (num_samples changed) no longer verifies.
    d = validate_update(dataclasses.replace(env, num_samples=9000), params, ctx)
    assert d.code == BAD_SIGNATURE
    # Received bytes that differ from the signed digest: tampering in transit.
    d = validate_update(env, params, ctx, received_sha256=signed_messages.sha256_hex(b"other"))
    assert d.code == DIGEST
    # A byte field replaced by False/0/"" must not encode like the empty one it was signed as
    # (bytes(False) == b""): the signature no longer verifies.
    for bogus in (False, 0, None, ""):
        d = validate_update(dataclasses.replace(env, transfer=bogus), params, ctx)
        assert d.code == BAD_SIGNATURE, (bogus, d)


def test_not_participant_and_auth_off(ctx):
    params = make_params()
    ctx.participants = {"robot_1"}
    assert validate_update(signed_envelope(params), params, ctx).code == NOT_PARTICIPANT
    open_ctx = ValidationContext(current_round=5, expected_manifest=MANIFEST)
    unsigned = signed_envelope(params, robot_id="anyone", signature=b"", nonce=b"")
    assert validate_update(unsigned, params, open_ctx)


def test_commit_false_does_not_record(ctx):
    params = make_params()
    env = signed_envelope(params)
    assert validate_update(env, params, ctx, commit=False)
    assert validate_update(env, params, ctx)  # still fresh
    assert not validate_update(env, params, ctx)


def test_decision_raise_if_rejected():
    ACCEPTED.raise_if_rejected()
    with pytest.raises(ValueError, match="oversize: too big"):
        Decision(False, OVERSIZE, "too big").raise_if_rejected()


def test_limits_validated():
    with pytest.raises(ValueError, match="max_update_bytes must be a positive int, got 0"):
        Limits(max_update_bytes=0)


# --------------------------------------------------------------------------- descriptors (V5)


@dataclasses.dataclass
class RawDescriptor:
    """ClientDescriptor's fields without its constructor checks: what a hostile message can
    carry."""

    robot_id: object
    kind: object
    mean: object = None
    variance: object = None
    num_samples: object = 0
    scores: object = dataclasses.field(default_factory=dict)
    residual_std: object = math.nan
    payload: object = b""


def gaussian(robot_id="robot_0", **over) -> RawDescriptor:
    fields = dict(
        robot_id=robot_id,
        kind="gaussian",
        mean=np.arange(6, dtype=np.float32),
        variance=np.full(6, 0.5, np.float32),
        num_samples=200,
    )
    fields.update(over)
    return RawDescriptor(**fields)


def test_real_client_descriptor_validates(ctx):
    desc = ClientDescriptor(
        robot_id="robot_1", kind="gaussian", mean=np.ones(6), variance=np.ones(6), num_samples=50
    )
    assert validate_descriptor(desc, ctx, dims=6, **signed_descriptor(desc))
    rnd = ClientDescriptor(
        robot_id="robot_2",
        kind="rnd",
        num_samples=50,
        scores={"robot_0": 0.5},
        residual_std=0.1,
        payload=b"predictor",
    )
    assert validate_descriptor(rnd, ctx, **signed_descriptor(rnd))


def signed_descriptor(desc, round_idx=5):
    nonce = signed_messages.new_nonce()
    digest = digest_of_descriptor(desc)
    return dict(
        round_idx=round_idx,
        nonce=nonce,
        signature=SIGNERS[desc.robot_id].sign_descriptor(round_idx, desc.robot_id, nonce, digest),
    )


def test_v5_valid_descriptor_accepted_and_replay_rejected(ctx):
    desc = gaussian()
    sig = signed_descriptor(desc)
    assert validate_descriptor(desc, ctx, dims=6, **sig)
    assert validate_descriptor(desc, ctx, dims=6, **sig).code == REPLAY


@pytest.mark.parametrize(
    "over, dims, needle",
    [
        (
            dict(variance=np.array([0.5, 0.5, 0, 0.5, 0.5, 0.5], np.float32)),
            6,
            "variance must be > 0, found 0.0",
        ),
        (dict(variance=np.full(6, -1.0, np.float32)), 6, "variance must be > 0, found -1.0"),
        (dict(mean=np.array([0, 1, np.nan, 3, 4, 5], np.float32)), 6, "mean has 1 NaN/Inf"),
        (dict(variance=np.full(5, 0.5, np.float32)), 6, "mean has 6 dims but variance 5"),
        ({}, 7, "announced dims 7 but mean has 6"),
        (dict(num_samples=10**9), 6, "num_samples 1000000000 exceeds the cap 10000"),
        (dict(kind="magic"), 6, "descriptor kind 'magic'"),
        (dict(mean=None), 6, "needs mean and variance"),
        (dict(mean=np.zeros((2, 3), np.float32)), 6, "1-D numeric vector"),
        (dict(scores={"robot_1": -1.0}), 6, "score for 'robot_1' is -1.0"),
        (dict(kind="rnd", residual_std=math.inf), 6, "residual_std inf"),
        (dict(kind="rnd", residual_std=math.nan), 6, "residual_std nan"),
    ],
)
def test_v5_bad_descriptors_rejected(ctx, over, dims, needle):
    desc = gaussian(**over)
    d = validate_descriptor(desc, ctx, dims=dims, **signed_descriptor(desc))
    assert not d and needle in d.reason, d
    assert len(ctx.replay_guard) == 0


def test_descriptor_dims_and_signature_checked(ctx):
    ctx.descriptor_dims = 8
    desc = gaussian()
    assert "expected 8" in validate_descriptor(desc, ctx, **signed_descriptor(desc)).reason
    ctx.descriptor_dims = None
    sig = signed_descriptor(desc)
    tampered = dataclasses.replace(desc, num_samples=9000)  # signed 200, claims 9000
    assert validate_descriptor(tampered, ctx, **sig).code == BAD_SIGNATURE


def test_descriptor_oversize_payload(ctx):
    ctx.limits = Limits(max_descriptor_payload_bytes=1000)
    desc = RawDescriptor(
        robot_id="robot_0", kind="rnd", num_samples=5, payload=b"\0" * 1001, residual_std=0.1
    )
    d = validate_descriptor(desc, ctx, **signed_descriptor(desc))
    assert d.code == OVERSIZE and "1001 bytes exceeds the cap 1000" in d.reason


# --------------------------------------------------------------------------- cluster models (robot)


def test_cluster_model_checks_on_the_robot():
    server = Signer.generate()
    params = make_params()
    digest = signed_messages.sha256_hex(payload_of(params))
    sig = server.sign_cluster_model(7, 1, digest)
    common = dict(
        cluster_id=1,
        round_idx=7,
        params=params,
        expected_manifest=MANIFEST,
        payload_sha256=digest,
        received_sha256=digest,
        signature=sig,
        server_public_key=server.public_key,
        total_bytes=288,
    )
    assert validate_cluster_model(**common, last_round=7)
    assert validate_cluster_model(**{**common, "round_idx": 6}, last_round=7).code == ROLLBACK
    assert validate_cluster_model(**{**common, "cluster_id": 0}).code == BAD_SIGNATURE
    assert validate_cluster_model(**{**common, "signature": b""}).code == UNSIGNED
    assert validate_cluster_model(**{**common, "total_bytes": 2**40}).code == OVERSIZE
    assert validate_cluster_model(**{**common, "received_sha256": "0" * 64}).code == DIGEST
    bad = {**params, "enc.bias": np.full(8, np.nan, np.float32)}
    assert validate_cluster_model(**{**common, "params": bad}).code == NON_FINITE
    assert (
        validate_cluster_model(**{**common, "params": {"x": np.zeros(3, np.float32)}}).code
        == SCHEMA
    )
    # Without a known manifest (first model after start-up) the values are still checked.
    assert (
        validate_cluster_model(**{**common, "expected_manifest": None, "params": bad}).code
        == NON_FINITE
    )


# --------------------------------------------------------------------------- audit log (P4)


def test_p4_audit_line_for_every_accept_and_reject(ctx, tmp_path):
    path = tmp_path / "audit.jsonl"
    params = make_params()
    bad = {**params, "enc.bias": np.full(8, np.nan, np.float32)}
    with AuditLog(path) as audit:
        for i, p in enumerate([params, bad, params]):
            env = signed_envelope(p, robot_id=f"robot_{i}")
            audit.record(
                kind="update",
                robot_id=env.robot_id,
                round_idx=5,
                decision=validate_update(env, p, ctx),
                num_samples=env.num_samples,
            )
        c = audit.counters(5)
    assert (c.received, c.accepted, c.rejected) == (3, 2, 1)
    assert c.by_code == {OK: 2, NON_FINITE: 1}
    assert "NaN/Inf" in c.reasons["robot_1"]
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [e["accepted"] for e in lines] == [True, False, True]
    assert lines[1]["code"] == NON_FINITE and "'enc.bias' has 8 NaN/Inf" in lines[1]["reason"]
    assert lines[0]["num_samples"] == 100 and lines[0]["round"] == 5
    assert read_audit_log(path) == lines
    assert AuditLog().counters(99).received == 0


def test_audit_counters_bounded():
    audit = AuditLog(keep_rounds=4)
    for r in range(10):
        audit.record(kind="update", robot_id="r", round_idx=r, decision=ACCEPTED)
    assert audit.counters(9).received == 1 and audit.counters(0).received == 0


@pytest.mark.parametrize(
    "desc",
    [
        ClientDescriptor(
            robot_id="robot_1",
            kind="gaussian",
            mean=np.linspace(0, 1, 5),
            variance=np.full(5, 0.3),
            num_samples=40,
        ),
        ClientDescriptor(
            robot_id="robot_1",
            kind="rnd",
            num_samples=40,
            scores={"robot_0": 0.25, "robot_2": 1.5},
            residual_std=0.05,
            payload=b"\x01predictor-bytes",
        ),
    ],
)
def test_descriptor_signature_survives_the_wire(ctx, desc):
    """Robot signs its core descriptor; the server verifies what descriptor_from_msg rebuilds."""
    from fed_ros.ros.wire.round_msgs import descriptor_from_msg, descriptor_to_msg

    nonce = signed_messages.new_nonce()
    sig = SIGNERS["robot_1"].sign_descriptor(5, "robot_1", nonce, digest_of_descriptor(desc))
    msg = descriptor_to_msg(desc, 5, nonce=nonce, signature=sig)
    received = descriptor_from_msg(msg)
    d = validate_descriptor(
        received,
        ctx,
        round_idx=int(msg.round),
        nonce=bytes(msg.nonce),
        signature=bytes(msg.signature),
        dims=int(msg.dims),
    )
    assert d, d


def test_audit_log_truncates_peer_fields_and_rotates_at_its_size_cap(tmp_path):
    """Issue 13: 1 MB ids and reasons from a peer cost at most a few hundred bytes per line, and
    the log never exceeds max_bytes x (1 + backups) on disk; counters stay bounded for junk ids."""
    path = tmp_path / "audit.jsonl"
    log = AuditLog(path, max_bytes=64 * 1024, backups=1)
    junk = "x" * (1 << 20)
    for i in range(2000):
        log.record(
            kind="update",
            robot_id=junk + str(i),
            round_idx=3,
            decision=Decision(False, "oversize", junk),
            payload_id=junk,
            sha256=junk,
        )
    log.close()
    files = sorted(tmp_path.iterdir())
    assert [f.name for f in files] == ["audit.jsonl", "audit.jsonl.1"]
    assert sum(f.stat().st_size for f in files) <= 2 * 64 * 1024
    entries = read_audit_log(path)
    assert entries and all(
        len(e["robot_id"]) <= 255 and len(e["payload_id"]) <= 256 for e in entries
    )
    counters = log.counters(3)
    assert counters.rejected == 2000 and len(counters.reasons) <= 1024
