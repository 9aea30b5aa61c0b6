"""Exact-value checks of the validation modules (decisions, sender_checks, payload_checks,
update_checks, descriptor_checks, audit_log), written against mutants that survived mutmut.

Each reject path is probed one input at a time with its exact code and the exact reason (which
names the offending value), each cap at / just above it, the digest a robot signs for a
descriptor byte for byte, and the audit log's entry fields, truncation, counters and rotation
(in tmp_path). Pure, no ROS, no torch; deterministic (hypothesis derandomized).
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from fed_ros.core.checks import audit_log as audit_mod, decisions
from fed_ros.core.security import signed_messages
from fed_ros.core.checks.audit_log import AuditLog, RoundCounters, read_audit_log
from fed_ros.core.checks.decisions import (
    ACCEPTED,
    BAD_SIGNATURE,
    DESCRIPTOR,
    DIGEST,
    Decision,
    FUTURE,
    LATE,
    Limits,
    MALFORMED,
    NON_FINITE,
    NOT_PARTICIPANT,
    NUM_SAMPLES,
    OUT_OF_RANGE,
    OVERSIZE,
    REPLAY,
    SCHEMA,
    SIZE_MISMATCH,
    STALE_BASE,
    UNKNOWN_ROBOT,
    UNSIGNED,
)
from fed_ros.core.checks.descriptor_checks import (
    DESCRIPTOR_KINDS,
    digest_of_descriptor,
    validate_descriptor,
)
from fed_ros.core.checks.payload_checks import (
    check_payload_manifest,
    check_tensors,
    compare_manifest,
    payload_size_range,
    validate_cluster_model,
)
from fed_ros.core.checks.sender_checks import ValidationContext
from fed_ros.core.checks.update_checks import UpdateEnvelope, check_update_envelope, validate_update
from fed_ros.core.encodings import BY_NAME, REGISTRY
from fed_ros.core.security.auth import AllowList, Signer
from fed_ros.core.security.replay import ReplayGuard
from fed_ros.core.checks.decisions import _is_int, _short
from fed_ros.core.params import TensorSpec

PROPS = settings(max_examples=50, deadline=None, database=None, derandomize=True)
REPO = Path(__file__).resolve().parents[2]
MiB = 1 << 20
ENCODING_FLOAT32 = BY_NAME["float32"].wire_id
ENCODING_FLOAT16 = BY_NAME["float16"].wire_id
ENCODING_INT8 = BY_NAME["int8"].wire_id

MANIFEST = (TensorSpec("w", (2, 3)), TensorSpec("b", (3,)))  # 9 values, 36 bytes as float32
SHA = "ab" * 32
NONCE = bytes(range(16))
SIGNER = Signer.generate()


def _params(scale: float = 1.0) -> dict[str, np.ndarray]:
    return {"w": np.full((2, 3), scale, np.float32), "b": np.zeros(3, np.float32)}


def _env(**over) -> UpdateEnvelope:
    fields = dict(
        robot_id="robot_0",
        round_idx=3,
        base_round=2,
        num_samples=10,
        manifest=MANIFEST,
        total_bytes=36,
        payload_sha256=SHA,
        nonce=NONCE,
    )
    fields.update(over)
    return UpdateEnvelope(**fields)


def _ctx(**over) -> ValidationContext:
    fields = dict(current_round=3, expected_manifest=MANIFEST)
    fields.update(over)
    return ValidationContext(**fields)


def _auth_ctx(**over) -> ValidationContext:
    guard = ReplayGuard()
    guard.advance(3)
    fields = dict(allow_list=AllowList({"robot_0": SIGNER.public_key}), replay_guard=guard)
    fields.update(over)
    return _ctx(**fields)


def _rejected(d: Decision, code: str, reason: str) -> None:
    assert d.accepted is False and bool(d) is False
    assert (d.code, d.reason) == (code, reason)


# ============================================================================= decisions


def test_reject_codes_are_the_stable_strings_reports_count():
    codes = dict(
        OK="ok",
        MALFORMED="malformed",
        LATE="late",
        FUTURE="future_round",
        NOT_PARTICIPANT="not_participant",
        OVERSIZE="oversize",
        SIZE_MISMATCH="size_mismatch",
        SCHEMA="schema",
        NON_FINITE="non_finite",
        OUT_OF_RANGE="out_of_range",
        NUM_SAMPLES="num_samples",
        STALE_BASE="stale_base",
        UNKNOWN_ROBOT="unknown_robot",
        UNSIGNED="unsigned",
        BAD_SIGNATURE="bad_signature",
        REPLAY="replay",
        DIGEST="digest_mismatch",
        DESCRIPTOR="bad_descriptor",
        ROLLBACK="rollback",
        DUPLICATE="duplicate",
        NO_ROUND="no_round",
        STALE_ROUND="stale_round",
        UNREACHABLE="unreachable",
        TRANSFER="transfer",
        FOREIGN_CHUNK="foreign_chunk",
    )
    assert {name: getattr(decisions, name) for name in codes} == codes


def test_default_limits_are_the_documented_caps():
    lim = Limits()
    assert (lim.max_update_bytes, lim.max_cluster_model_bytes) == (512 * 2**20, 512 * 2**20)
    assert (
        lim.max_num_samples,
        lim.max_descriptor_dims,
        lim.max_descriptor_payload_bytes,
        lim.max_scores,
    ) == (10_000_000, 65_536, 16 * 2**20, 4_096)
    assert lim.max_abs_value == 1e6


@pytest.mark.parametrize(
    "name",
    [
        "max_update_bytes",
        "max_cluster_model_bytes",
        "max_num_samples",
        "max_descriptor_dims",
        "max_descriptor_payload_bytes",
        "max_scores",
    ],
)
@pytest.mark.parametrize("bad", [0, -1, True, 1.0, np.float64(2.0), "3", None])
def test_limits_reject_every_non_positive_int_field_naming_it(name, bad):
    with pytest.raises(ValueError) as err:
        Limits(**{name: bad})
    assert str(err.value) == f"Limits.{name} must be a positive int, got {bad!r}"


@pytest.mark.parametrize("bad", [0, 0.0, -1e-300, -5, "1", None, math.nan])
def test_limits_max_abs_value_must_be_a_positive_number(bad):
    with pytest.raises(ValueError) as err:
        Limits(max_abs_value=bad)
    assert str(err.value) == f"Limits.max_abs_value must be > 0, got {bad!r}"


@pytest.mark.parametrize("ok", [1, 1e-300, 5, math.inf])
def test_limits_max_abs_value_accepts_int_and_float(ok):
    assert Limits(max_abs_value=ok).max_abs_value == ok


def test_decision_defaults_truthiness_and_raise():
    assert Decision(True) == ACCEPTED and (ACCEPTED.code, ACCEPTED.reason) == ("ok", "accepted")
    assert bool(ACCEPTED) is True and ACCEPTED.accepted is True
    d = Decision(False, LATE, "too late")
    assert bool(d) is False
    assert ACCEPTED.raise_if_rejected() is None
    with pytest.raises(ValueError) as err:
        d.raise_if_rejected()
    assert str(err.value) == "late: too late"


@pytest.mark.parametrize(
    "x, expected",
    [
        (0, True),
        (-3, True),
        (2**70, True),
        (np.int8(1), True),
        (np.uint64(5), True),
        (True, False),
        (np.bool_(True), False),
        (1.0, False),
        (np.float32(1), False),
        ("1", False),
        (None, False),
    ],
)
def test_is_int_accepts_python_and_numpy_ints_but_not_bools(x, expected):
    assert _is_int(x) is expected


def test_short_bounds_a_peer_value_to_its_width_plus_ellipsis():
    at = "x" * 58  # repr adds two quotes: exactly 60 chars, kept whole
    assert _short(at) == repr(at)
    over = "x" * 59  # 61 chars: cut to 60 + "..."
    assert _short(over) == repr(over)[:60] + "..." and len(_short(over)) == 63
    assert _short("abcdef", 4) == "'abc..." and _short("ab", 4) == "'ab'"
    assert _short(12345) == "12345"


@PROPS
@given(st.text(max_size=200), st.integers(1, 80))
def test_short_law_prefix_of_repr_and_bounded(text, n):
    out = _short(text, n)
    full = repr(text)
    assert out == full if len(full) <= n else out == full[:n] + "..."
    assert len(out) <= n + 3


# ============================================================================= sender checks


def test_validation_context_defaults_are_open():
    ctx = ValidationContext(current_round=0)
    assert ctx.expected_manifest is None and ctx.base_rounds is None and ctx.participants is None
    assert ctx.allow_list is None and ctx.replay_guard is None and ctx.deadline_passed is False
    assert ctx.descriptor_kinds is None and ctx.descriptor_dims is None and ctx.limits == Limits()


@pytest.mark.parametrize(
    "robot_id, reason",
    [
        ("", "robot id '' must be a non-empty string <= 255 chars"),
        (None, "robot id None must be a non-empty string <= 255 chars"),
        (7, "robot id 7 must be a non-empty string <= 255 chars"),
        ("r" * 256, f"robot id {repr('r' * 256)[:60]}... must be a non-empty string <= 255 chars"),
    ],
)
def test_sender_malformed_robot_id_named_in_reason(robot_id, reason):
    _rejected(check_update_envelope(_env(robot_id=robot_id), _ctx()), MALFORMED, reason)


@pytest.mark.parametrize("round_idx", [-1, 2.0, True, "3", None])
def test_sender_malformed_round_named_in_reason(round_idx):
    _rejected(
        check_update_envelope(_env(round_idx=round_idx, base_round=0), _ctx()),
        MALFORMED,
        f"round {round_idx!r} must be an integer >= 0",
    )


def test_sender_round_zero_accepted_and_numpy_round_accepted():
    assert check_update_envelope(_env(round_idx=0, base_round=0), _ctx(current_round=0))
    assert check_update_envelope(_env(round_idx=np.int64(3)), _ctx())


def test_sender_late_future_deadline_participant_reasons():
    _rejected(
        check_update_envelope(_env(round_idx=2, base_round=0), _ctx()),
        LATE,
        "robot 'robot_0': round 2 is over (current round 3)",
    )
    _rejected(
        check_update_envelope(_env(round_idx=4), _ctx()),
        FUTURE,
        "robot 'robot_0': round 4 has not started (current round 3)",
    )
    _rejected(
        check_update_envelope(_env(), _ctx(deadline_passed=True)),
        LATE,
        "robot 'robot_0': arrived after the deadline of round 3",
    )
    _rejected(
        check_update_envelope(_env(), _ctx(participants={"robot_1"})),
        NOT_PARTICIPANT,
        "robot 'robot_0' is not a participant of round 3",
    )
    assert check_update_envelope(_env(), _ctx(participants={"robot_0", "robot_1"}))
    assert check_update_envelope(_env(), _ctx(participants=None))
    _rejected(
        check_update_envelope(_env(), _ctx(participants=())),
        NOT_PARTICIPANT,
        "robot 'robot_0' is not a participant of round 3",
    )


@pytest.mark.parametrize(
    "n, code, reason",
    [
        (1.0, MALFORMED, "robot 'robot_0': num_samples 1.0 is not an integer"),
        (True, MALFORMED, "robot 'robot_0': num_samples True is not an integer"),
        ("9", MALFORMED, "robot 'robot_0': num_samples '9' is not an integer"),
        (0, NUM_SAMPLES, "robot 'robot_0': num_samples 0 must be >= 1"),
        (-5, NUM_SAMPLES, "robot 'robot_0': num_samples -5 must be >= 1"),
        (11, NUM_SAMPLES, "robot 'robot_0': num_samples 11 exceeds the cap 10"),
    ],
)
def test_num_samples_reasons(n, code, reason):
    ctx = _ctx(limits=Limits(max_num_samples=10))
    _rejected(check_update_envelope(_env(num_samples=n), ctx), code, reason)


@pytest.mark.parametrize("n", [1, 10, np.int64(10), np.uint8(1)])
def test_num_samples_inside_the_cap_accepted(n):
    assert check_update_envelope(_env(num_samples=n), _ctx(limits=Limits(max_num_samples=10)))


# ------------------------------------------------------------------------------ auth


def _signed_env(signer: Signer = SIGNER, **over) -> UpdateEnvelope:
    return _env(**over).signed(signer)


def test_auth_nonce_and_signature_must_be_bytes_like():
    for nonce, sig in [
        ("n" * 16, b""),
        (NONCE, "sig"),
        (None, b""),
        (NONCE, None),
        (list(NONCE), b""),
    ]:
        _rejected(
            check_update_envelope(_env(nonce=nonce, signature=sig), _ctx()),
            MALFORMED,
            "robot 'robot_0': nonce/signature must be bytes",
        )
    # bytearray and memoryview are bytes too (what a message field converts to).
    assert check_update_envelope(_env(nonce=bytearray(NONCE), signature=bytearray()), _ctx())
    assert check_update_envelope(_env(nonce=memoryview(NONCE), signature=memoryview(b"")), _ctx())
    env = _signed_env()
    ctx = _auth_ctx()
    assert check_update_envelope(dataclasses.replace(env, signature=bytearray(env.signature)), ctx)
    assert check_update_envelope(dataclasses.replace(env, signature=memoryview(env.signature)), ctx)


def test_auth_unknown_unsigned_forged_reasons():
    ctx = _auth_ctx()
    assert check_update_envelope(_signed_env(), ctx)
    _rejected(
        check_update_envelope(_signed_env(robot_id="robot_9"), ctx),
        UNKNOWN_ROBOT,
        "unknown robot 'robot_9': no public key on the allow-list",
    )
    _rejected(
        check_update_envelope(_env(), ctx), UNSIGNED, "robot 'robot_0': message is not signed"
    )
    _rejected(
        check_update_envelope(_signed_env(Signer.generate()), ctx),
        BAD_SIGNATURE,
        "robot 'robot_0': bad signature (64 bytes)",
    )
    _rejected(
        check_update_envelope(_env(signature=b"\x01"), ctx),
        BAD_SIGNATURE,
        "robot 'robot_0': bad signature (1 bytes)",
    )


@pytest.mark.parametrize(
    "field, value",
    [
        ("round_idx", None),
        ("base_round", 1),
        ("num_samples", 11),
        ("cluster_id", 4),
        ("payload_sha256", "cd" * 32),
        ("nonce", bytes(16)),
        ("transfer", b"other header"),
    ],
)
def test_signed_envelope_covers_every_signed_field(field, value):
    """UpdateEnvelope.signed signs each field it carries: change one after signing and it fails."""
    env = _signed_env(cluster_id=3, transfer=b"header")
    ctx = _auth_ctx()
    assert check_update_envelope(env, ctx)
    if (
        field == "round_idx"
    ):  # a later round is refused as FUTURE before the signature: re-sign another round
        other = _env(round_idx=4, base_round=2, cluster_id=3, transfer=b"header").signed(SIGNER)
        moved = dataclasses.replace(other, signature=env.signature)
        ctx4 = _auth_ctx(current_round=4)
        assert check_update_envelope(moved, ctx4).code == BAD_SIGNATURE
        return
    d = check_update_envelope(dataclasses.replace(env, **{field: value}), ctx)
    assert d.code == BAD_SIGNATURE, d


def test_signed_copy_keeps_every_other_field():
    env = _env(cluster_id=5, transfer=b"t", encoding=ENCODING_FLOAT32)
    signed = env.signed(SIGNER)
    assert dataclasses.replace(signed, signature=b"") == env and len(signed.signature) == 64
    assert (
        SIGNER.sign_update(
            3, "robot_0", NONCE, SHA, base_round=2, num_samples=10, cluster_id=5, transfer=b"t"
        )
        == signed.signature
    )


def test_replay_nonce_length_and_reuse_without_an_allow_list():
    guard = ReplayGuard()
    guard.advance(3)
    ctx = _ctx(replay_guard=guard)
    for size in (0, 15, 17):
        _rejected(
            check_update_envelope(_env(nonce=b"n" * size), ctx),
            REPLAY,
            f"robot 'robot_0': nonce must be 16 bytes, got {size}",
        )
    assert validate_update(_env(), _params(), ctx)
    _rejected(
        check_update_envelope(_env(), ctx),
        REPLAY,
        f"robot 'robot_0': nonce {NONCE.hex()} already used (replay)",
    )
    # A bytearray nonce is the same nonce.
    assert check_update_envelope(_env(nonce=bytearray(NONCE)), ctx).code == REPLAY
    # Without a guard nonces are not looked at at all.
    assert check_update_envelope(_env(nonce=b""), _ctx())


def test_auth_checks_signature_before_the_replay_guard():
    ctx = _auth_ctx()
    env = _signed_env()
    assert validate_update(env, _params(), ctx)
    forged = _signed_env(Signer.generate())
    assert check_update_envelope(forged, ctx).code == BAD_SIGNATURE  # not REPLAY
    assert check_update_envelope(env, ctx).code == REPLAY


# ============================================================================= payload checks


def test_encoding_registry_holds_the_wire_values():
    assert [(e.name, e.wire_id, e.delta, e.bytes_per_value) for e in REGISTRY] == [
        ("float32", 0, False, 4),
        ("float16", 1, False, 2),
        ("int8", 2, False, 1),
        ("int8_block", 3, False, 1),
        ("topk", 4, True, 8),
        ("int4_block", 5, False, 0.5),
        ("int8_delta", 6, True, 1),
        ("int4_delta", 7, True, 0.5),
    ]


def test_encoding_registry_mirrors_the_message_definition():
    msg = REPO / "msg" / "TensorPayload.msg"  # the mutation runner copies msg/ too
    wire = {
        m.group(1): int(m.group(2))
        for m in re.finditer(r"uint8 (ENCODING_\w+)=(\d+)", msg.read_text())
    }
    assert wire == {f"ENCODING_{e.name.upper()}": e.wire_id for e in REGISTRY}


def expected_payload_bytes(manifest, encoding=ENCODING_FLOAT32):
    lo, hi = payload_size_range(manifest, encoding)
    assert lo == hi, f"encoding {encoding} has no fixed size"
    return lo


def test_payload_size_range_per_encoding_and_unknown_encoding():
    assert expected_payload_bytes(MANIFEST) == 36
    assert [expected_payload_bytes(MANIFEST, e) for e in (0, 1, 2)] == [36, 18, 9]
    assert expected_payload_bytes((TensorSpec("s", ()),)) == 4  # a scalar holds one value
    assert expected_payload_bytes((TensorSpec("e", (0, 5)), TensorSpec("x", (2,)))) == 8
    assert expected_payload_bytes(()) == 0
    # int8_block: per tensor one float32 scale per 128 values, then one byte per value.
    assert expected_payload_bytes(MANIFEST, 3) == sum(
        4 * -(-math.prod(s.shape) // 128) + math.prod(s.shape) for s in MANIFEST
    )
    big = (TensorSpec("w", (128,)), TensorSpec("b", (129,)), TensorSpec("e", (0,)))
    assert expected_payload_bytes(big, 3) == (4 + 128) + (8 + 129) + 0
    with pytest.raises(ValueError) as err:
        payload_size_range(MANIFEST, 8)
    assert str(err.value) == "unknown payload encoding 8"
    for delta in (4, 6, 7):  # topk and the deflated deltas: a range, checked on decoding
        lo, hi = payload_size_range(MANIFEST, delta)
        assert 0 < lo < hi, delta


@PROPS
@given(st.lists(st.lists(st.integers(0, 6), max_size=3), max_size=4), st.sampled_from([0, 1, 2]))
def test_expected_payload_bytes_law(shapes, encoding):
    manifest = tuple(TensorSpec(f"t{i}", tuple(s)) for i, s in enumerate(shapes))
    assert (
        expected_payload_bytes(manifest, encoding)
        == sum(int(np.prod(s, dtype=np.int64)) for s in shapes) * (4, 2, 1)[encoding]
    )


def test_check_payload_manifest_size_and_encoding():
    assert check_payload_manifest(MANIFEST, 36, ENCODING_FLOAT32, MANIFEST)
    assert check_payload_manifest(MANIFEST, 18, ENCODING_FLOAT16, MANIFEST)
    assert check_payload_manifest(MANIFEST, 9, ENCODING_INT8, MANIFEST)
    _rejected(
        check_payload_manifest(MANIFEST, 36, ENCODING_FLOAT16, MANIFEST),
        SIZE_MISMATCH,
        "total_bytes 36 != 18 bytes implied by the manifest and encoding 1",
    )
    _rejected(
        check_payload_manifest(MANIFEST[:1], 24, 0, MANIFEST),
        SCHEMA,
        "manifest has 1 tensors, expected 2",
    )


@pytest.mark.parametrize(
    "announced, reason",
    [
        (5, "manifest 5 is not a sequence"),
        ([("w", (2, 3), "float32")], "manifest has 1 tensors, expected 2"),
        (
            [("w", (2, 3)), ("b", (3,), "float32")],
            "manifest entry 0: manifest entry ('w', (2, 3)) has no name/shape/dtype",
        ),
        ([7, ("b", (3,), "float32")], "manifest entry 0: manifest entry 7 has no name/shape/dtype"),
        (
            [("w", (2, 3), "float32"), (3, (3,), "float32")],
            "manifest entry 1: manifest entry name 3 is not a string",
        ),
        (
            [("w", 6, "float32"), ("b", (3,), "float32")],
            "manifest entry 0: tensor 'w': shape 6 is not a sequence",
        ),
        (
            [("w", (2, -3), "float32"), ("b", (3,), "float32")],
            "manifest entry 0: tensor 'w': shape (2, -3) must hold integers >= 0",
        ),
        (
            [("w", (2, 3.0), "float32"), ("b", (3,), "float32")],
            "manifest entry 0: tensor 'w': shape (2, 3.0) must hold integers >= 0",
        ),
        (
            [("w", (2, 3), 4), ("b", (3,), "float32")],
            "manifest entry 0: tensor 'w': dtype 4 is not a string",
        ),
        (
            [("b", (3,), "float32"), ("w", (2, 3), "float32")],
            "tensor 'b' at position 0, expected 'w'",
        ),
        (
            [("w", (3, 2), "float32"), ("b", (3,), "float32")],
            "tensor 'w' has shape (3, 2), expected (2, 3)",
        ),
        (
            [("w", (2, 3), "float32"), ("b", (3,), "float16")],
            "tensor 'b' has dtype 'float16', expected 'float32'",
        ),
    ],
)
def test_compare_manifest_reasons(announced, reason):
    assert compare_manifest(announced, MANIFEST) == reason
    _rejected(check_payload_manifest(announced, 36, 0, MANIFEST), SCHEMA, reason)


def test_compare_manifest_accepts_tuples_lists_specs_and_numpy_dims():
    class Spec:  # a message's TensorSpec: attributes, shape as a numpy array
        def __init__(self, name, shape, dtype):
            self.name, self.shape, self.dtype = name, np.asarray(shape, np.uint32), dtype

    assert compare_manifest(MANIFEST, MANIFEST) is None
    assert compare_manifest([["w", [2, 3], "float32"], ("b", [3], "float32")], MANIFEST) is None
    assert (
        compare_manifest([Spec("w", (2, 3), "float32"), Spec("b", (3,), "float32")], MANIFEST)
        is None
    )
    empty = (TensorSpec("e", (0,)),)
    assert compare_manifest([("e", (0,), "float32")], empty) is None  # zero-size dims are dims
    assert compare_manifest([], ()) is None


@pytest.mark.parametrize(
    "params, code, reason",
    [
        ([1, 2], MALFORMED, "parameters are list, expected a mapping"),
        (None, MALFORMED, "parameters are NoneType, expected a mapping"),
        ({"w": np.zeros((2, 3), np.float32)}, SCHEMA, "update has 1 tensors, expected 2"),
        (
            {"x": np.zeros((2, 3), np.float32), "b": np.zeros(3, np.float32)},
            SCHEMA,
            "tensor 'x' at position 0, expected 'w'",
        ),
        (
            {"w": [[0.0] * 3] * 2, "b": np.zeros(3, np.float32)},
            SCHEMA,
            "tensor 'w' is list, expected numpy.ndarray",
        ),
        (
            {"w": np.zeros((3, 2), np.float32), "b": np.zeros(3, np.float32)},
            SCHEMA,
            "tensor 'w' has shape (3, 2), expected (2, 3)",
        ),
        (
            {"w": np.zeros((2, 3), np.float32), "b": np.zeros(3, np.float64)},
            SCHEMA,
            "tensor 'b' has dtype float64, expected float32",
        ),
    ],
)
def test_check_tensors_schema_reasons(params, code, reason):
    _rejected(check_tensors(params, MANIFEST, 1e6), code, reason)


def test_check_tensors_value_reasons_and_the_cap():
    p = _params()
    p["b"][1] = np.nan
    p["b"][2] = -np.inf
    _rejected(check_tensors(p, MANIFEST, 1e6), NON_FINITE, "tensor 'b' has 2 NaN/Inf values")
    _rejected(
        check_tensors(_params(-2.5e6), MANIFEST, 1e6),
        OUT_OF_RANGE,
        "tensor 'w' has |value| 2.5e+06 > max_abs_value 1e+06",
    )
    _rejected(
        check_tensors(_params(3.0), MANIFEST, 2.5),
        OUT_OF_RANGE,
        "tensor 'w' has |value| 3 > max_abs_value 2.5",
    )
    assert check_tensors(_params(2.5), MANIFEST, 2.5) and check_tensors(
        _params(-2.5), MANIFEST, 2.5
    )


def test_an_empty_tensor_does_not_stop_the_value_checks_of_the_next():
    manifest = (TensorSpec("e", (0,)), TensorSpec("x", (2,)))
    ok = {"e": np.zeros(0, np.float32), "x": np.ones(2, np.float32)}
    assert check_tensors(ok, manifest, 1e6)
    bad = {"e": np.zeros(0, np.float32), "x": np.array([1.0, np.nan], np.float32)}
    _rejected(check_tensors(bad, manifest, 1e6), NON_FINITE, "tensor 'x' has 1 NaN/Inf values")
    big = {"e": np.zeros(0, np.float32), "x": np.array([1.0, -7.0], np.float32)}
    assert check_tensors(big, manifest, 6.0).code == OUT_OF_RANGE


@PROPS
@given(
    st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), min_size=1, max_size=8),
    st.floats(1e-3, 1e9),
)
def test_check_tensors_law(values, cap):
    arr = np.asarray(values, np.float32)
    d = check_tensors({"x": arr}, (TensorSpec("x", arr.shape),), cap)
    if not np.isfinite(arr).all():
        assert d.code == NON_FINITE
    elif np.abs(arr.astype(np.float64)).max() > cap:
        assert d.code == OUT_OF_RANGE
    else:
        assert d.accepted


def test_cluster_model_default_limits_and_header_only():
    d = validate_cluster_model(
        cluster_id=0, round_idx=0, params=None, expected_manifest=None, total_bytes=512 * MiB
    )
    assert d
    assert (
        validate_cluster_model(
            cluster_id=0,
            round_idx=0,
            params=None,
            expected_manifest=None,
            total_bytes=512 * MiB + 1,
        ).code
        == OVERSIZE
    )
    big = {"w": np.full(2, 1e6, np.float32)}
    assert validate_cluster_model(cluster_id=0, round_idx=0, params=big, expected_manifest=None)
    big["w"][0] = 1.5e6
    _rejected(
        validate_cluster_model(cluster_id=0, round_idx=0, params=big, expected_manifest=None),
        OUT_OF_RANGE,
        "cluster 0 round 0: tensor 'w' has |value| 1.5e+06 > max_abs_value 1e+06",
    )


def test_cluster_model_without_manifest_names_the_schema_problem():
    ok = {"w": np.ones(2, np.float32)}
    assert validate_cluster_model(cluster_id=2, round_idx=1, params=ok, expected_manifest=None)
    _rejected(
        validate_cluster_model(
            cluster_id=2, round_idx=1, params={"w": np.ones(2)}, expected_manifest=None
        ),
        SCHEMA,
        "cluster 2 round 1: parameters must be float32 numpy arrays",
    )
    _rejected(
        validate_cluster_model(
            cluster_id=2, round_idx=1, params=_params(), expected_manifest=MANIFEST[:1]
        ),
        SCHEMA,
        "cluster 2 round 1: update has 2 tensors, expected 1",
    )


# ============================================================================= update checks


def test_update_envelope_defaults():
    env = UpdateEnvelope(
        robot_id="r",
        round_idx=1,
        base_round=0,
        num_samples=1,
        manifest=(),
        total_bytes=0,
        payload_sha256=SHA,
    )
    assert (env.encoding, env.cluster_id, env.nonce, env.signature, env.transfer) == (
        0,
        -1,
        b"",
        b"",
        b"",
    )


@pytest.mark.parametrize(
    "over, code, reason",
    [
        (dict(total_bytes=-1), MALFORMED, "robot 'robot_0': total_bytes -1 is not a size"),
        (dict(total_bytes=36.0), MALFORMED, "robot 'robot_0': total_bytes 36.0 is not a size"),
        (dict(total_bytes=None), MALFORMED, "robot 'robot_0': total_bytes None is not a size"),
        (
            dict(total_bytes=37),
            OVERSIZE,
            "robot 'robot_0': update of 37 bytes exceeds the cap 36 bytes",
        ),
        (dict(encoding=8), MALFORMED, "robot 'robot_0': unknown encoding 8"),
        (dict(encoding=-1), MALFORMED, "robot 'robot_0': unknown encoding -1"),
        (dict(encoding=0.0), MALFORMED, "robot 'robot_0': unknown encoding 0.0"),
        (dict(encoding=False), MALFORMED, "robot 'robot_0': unknown encoding False"),
        (
            dict(total_bytes=35),
            SIZE_MISMATCH,
            "robot 'robot_0': total_bytes 35 != 36 bytes implied by the manifest and encoding 0",
        ),
        (
            dict(manifest=MANIFEST[::-1]),
            SCHEMA,
            "robot 'robot_0': tensor 'b' at position 0, expected 'w'",
        ),
        (dict(base_round=-1), MALFORMED, "robot 'robot_0': base_round -1 is not a round"),
        (dict(base_round=1.0), MALFORMED, "robot 'robot_0': base_round 1.0 is not a round"),
        (dict(base_round=None), MALFORMED, "robot 'robot_0': base_round None is not a round"),
        (dict(base_round=4), STALE_BASE, "robot 'robot_0': base_round 4 is after round 3"),
        (
            dict(payload_sha256="ab" * 31 + "a"),
            MALFORMED,
            f"robot 'robot_0': payload sha256 {repr('ab' * 31 + 'a')[:60]}... is not 64 hex chars",
        ),
        (
            dict(payload_sha256="a" * 65),
            MALFORMED,
            f"robot 'robot_0': payload sha256 {repr('a' * 65)[:60]}... is not 64 hex chars",
        ),
        (
            dict(payload_sha256=b"a" * 64),
            MALFORMED,
            f"robot 'robot_0': payload sha256 {repr(b'a' * 64)[:60]}... is not 64 hex chars",
        ),
        (dict(cluster_id=-2), MALFORMED, "robot 'robot_0': cluster_id -2 must be an int >= -1"),
        (
            dict(cluster_id=2**31),
            MALFORMED,
            "robot 'robot_0': cluster_id 2147483648 must be an int >= -1",
        ),
        (dict(cluster_id=1.0), MALFORMED, "robot 'robot_0': cluster_id 1.0 must be an int >= -1"),
    ],
)
def test_update_envelope_field_reasons(over, code, reason):
    ctx = _ctx(limits=Limits(max_update_bytes=36))
    _rejected(check_update_envelope(_env(**over), ctx), code, reason)


def test_update_envelope_accepts_every_encoding_and_edge_values():
    ctx = _ctx(limits=Limits(max_update_bytes=36))
    assert check_update_envelope(_env(encoding=1, total_bytes=18), ctx)
    assert check_update_envelope(_env(encoding=2, total_bytes=9), ctx)
    assert check_update_envelope(_env(encoding=np.uint8(0)), ctx)
    assert check_update_envelope(_env(total_bytes=36), ctx)
    assert check_update_envelope(_env(base_round=3), ctx) and check_update_envelope(
        _env(base_round=0), ctx
    )
    assert check_update_envelope(_env(cluster_id=-1), ctx)
    assert check_update_envelope(_env(cluster_id=2**31 - 1), ctx)


def test_update_of_only_empty_tensors_has_zero_bytes_and_is_a_size():
    manifest = (TensorSpec("e", (0, 4)),)
    ctx = _ctx(expected_manifest=manifest)
    assert check_update_envelope(_env(manifest=manifest, total_bytes=0), ctx)
    assert validate_update(
        _env(manifest=manifest, total_bytes=0), {"e": np.zeros((0, 4), np.float32)}, ctx
    )
    assert check_update_envelope(_env(total_bytes=0), _ctx(expected_manifest=None))


def test_update_envelope_without_an_expected_manifest_leaves_the_payload_to_the_receiver():
    ctx = _ctx(expected_manifest=None, limits=Limits(max_update_bytes=100))
    assert check_update_envelope(
        _env(manifest=[("anything", (1,), "float64")], total_bytes=99), ctx
    )
    # ...but the size cap still holds.
    assert check_update_envelope(_env(total_bytes=101), ctx).code == OVERSIZE


def test_update_base_rounds_reason_lists_them_sorted():
    _rejected(
        check_update_envelope(_env(base_round=1), _ctx(base_rounds={2, 0})),
        STALE_BASE,
        "robot 'robot_0': trained from model version 1, expected one of [0, 2]",
    )
    assert check_update_envelope(_env(base_round=2), _ctx(base_rounds={2, 0}))
    assert check_update_envelope(_env(base_round=1), _ctx(base_rounds=None))


def test_update_check_order_sender_first_then_size_then_manifest_then_samples():
    ctx = _ctx(limits=Limits(max_update_bytes=36, max_num_samples=10))
    everything_wrong = _env(round_idx=2, total_bytes=10**9, num_samples=0, base_round=9)
    assert check_update_envelope(everything_wrong, ctx).code == LATE
    assert (
        check_update_envelope(dataclasses.replace(everything_wrong, round_idx=3), ctx).code
        == OVERSIZE
    )
    assert check_update_envelope(_env(total_bytes=35, num_samples=0), ctx).code == SIZE_MISMATCH
    assert check_update_envelope(_env(num_samples=0, base_round=9), ctx).code == NUM_SAMPLES
    assert check_update_envelope(_env(base_round=9, cluster_id=-5), ctx).code == STALE_BASE


def test_update_envelope_exception_is_a_malformed_decision():
    class Boom(ValidationContext):
        @property
        def limits(self):
            raise RuntimeError("context broke")

        @limits.setter
        def limits(self, value):
            pass

    ctx = Boom(current_round=3)
    _rejected(
        check_update_envelope(_env(), ctx),
        MALFORMED,
        "update envelope could not be checked: RuntimeError: context broke",
    )
    _rejected(
        validate_update(_env(), _params(), ctx),
        MALFORMED,
        "update could not be validated: RuntimeError: context broke",
    )


def test_validate_update_digest_reason_and_tensor_reasons():
    ctx = _ctx()
    assert validate_update(_env(), _params(), ctx, received_sha256=SHA)
    assert validate_update(_env(), _params(), ctx, received_sha256=None)
    _rejected(
        validate_update(_env(), _params(), ctx, received_sha256="cd" * 32),
        DIGEST,
        "robot 'robot_0': received bytes hash to 'cdcdcdcdcdcdcdcdcdc..., announced "
        "abababababababab...",
    )
    bad = _params()
    bad["b"][0] = np.inf
    _rejected(
        validate_update(_env(), bad, ctx),
        NON_FINITE,
        "robot 'robot_0': tensor 'b' has 1 NaN/Inf values",
    )
    # Envelope problems come first, and are returned unchanged.
    _rejected(
        validate_update(_env(round_idx=4), bad, ctx),
        FUTURE,
        "robot 'robot_0': round 4 has not started (current round 3)",
    )


def test_validate_update_records_the_nonce_only_on_commit_of_an_accept():
    guard = ReplayGuard()
    guard.advance(3)
    ctx = _ctx(replay_guard=guard)
    bad = _params()
    bad["w"][0, 0] = np.nan
    assert not validate_update(_env(), bad, ctx) and len(guard) == 0
    assert (
        not validate_update(_env(), _params(), ctx, received_sha256="00" * 32) and len(guard) == 0
    )
    assert validate_update(_env(), _params(), ctx, commit=False) and len(guard) == 0
    assert validate_update(_env(), _params(), ctx) and len(guard) == 1
    assert guard.check("robot_0", 3, NONCE) is not None  # recorded for this robot's round
    assert guard.state()["nonces"] == [[NONCE.hex(), 3]]
    # A bytearray nonce is stored as bytes.
    other = bytes(range(1, 17))
    assert validate_update(_env(nonce=bytearray(other)), _params(), ctx) and len(guard) == 2


# ============================================================================= descriptors


@dataclasses.dataclass
class Desc:
    """A descriptor as a hostile message can carry it (no constructor checks)."""

    robot_id: object = "robot_0"
    kind: object = "gaussian"
    mean: object = dataclasses.field(default_factory=lambda: np.array([0.0, 1.0, 2.0]))
    variance: object = dataclasses.field(default_factory=lambda: np.array([0.5, 1.0, 2.0]))
    num_samples: object = 10
    scores: object = dataclasses.field(default_factory=dict)
    residual_std: object = math.nan
    payload: object = b""


def _rnd(**over) -> Desc:
    fields = dict(
        kind="rnd",
        mean=None,
        variance=None,
        scores={"robot_1": 0.5},
        residual_std=0.1,
        payload=b"predictor",
    )
    fields.update(over)
    return Desc(**fields)


def _vd(desc, ctx=None, **kw) -> Decision:
    return validate_descriptor(
        desc, ctx if ctx is not None else _ctx(), round_idx=kw.pop("round_idx", 3), **kw
    )


def test_descriptor_kinds_constant():
    assert DESCRIPTOR_KINDS == ("gaussian", "rnd", "update", "embedding")


def test_valid_descriptors_of_every_kind_accepted():
    assert _vd(Desc()) and _vd(_rnd())
    assert _vd(Desc(kind="update", variance=None)) and _vd(Desc(kind="embedding", variance=None))
    assert _vd(Desc(kind="update", mean=None, variance=None))


def test_descriptor_sender_problems_come_first():
    _rejected(
        _vd(Desc(robot_id="")), MALFORMED, "robot id '' must be a non-empty string <= 255 chars"
    )
    _rejected(_vd(Desc(), round_idx=2), LATE, "robot 'robot_0': round 2 is over (current round 3)")
    _rejected(_vd(object()), MALFORMED, "robot id None must be a non-empty string <= 255 chars")


def test_descriptor_kind_reasons_and_custom_kinds():
    _rejected(
        _vd(Desc(kind="magic")),
        DESCRIPTOR,
        "robot 'robot_0': descriptor kind 'magic' not in ['gaussian', 'rnd', 'update', "
        "'embedding']",
    )
    _rejected(
        _vd(Desc(kind=None)),
        DESCRIPTOR,
        "robot 'robot_0': descriptor kind None not in ['gaussian', 'rnd', 'update', 'embedding']",
    )
    only = _ctx(descriptor_kinds=["rnd"])
    _rejected(
        _vd(Desc(), only), DESCRIPTOR, "robot 'robot_0': descriptor kind 'gaussian' not in ['rnd']"
    )
    assert _vd(_rnd(), only)
    assert _vd(Desc(kind="custom", variance=None), _ctx(descriptor_kinds={"custom"}))


def test_descriptor_num_samples_reasons():
    _rejected(_vd(Desc(num_samples=0)), NUM_SAMPLES, "robot 'robot_0': num_samples 0 must be >= 1")
    _rejected(
        _vd(Desc(num_samples=None)),
        MALFORMED,
        "robot 'robot_0': num_samples None is not an integer",
    )
    _rejected(
        _vd(Desc(num_samples=11), _ctx(limits=Limits(max_num_samples=10))),
        NUM_SAMPLES,
        "robot 'robot_0': num_samples 11 exceeds the cap 10",
    )


@pytest.mark.parametrize("field", ["mean", "variance"])
@pytest.mark.parametrize(
    "value, code, reason",
    [
        (
            np.zeros((1, 3)),
            DESCRIPTOR,
            "{f} must be a 1-D numeric vector, got dtype float64 shape (1, 3)",
        ),
        (
            np.float64(1.0),
            DESCRIPTOR,
            "{f} must be a 1-D numeric vector, got dtype float64 shape ()",
        ),
        (
            np.array([True, False, True]),
            DESCRIPTOR,
            "{f} must be a 1-D numeric vector, got dtype bool shape (3,)",
        ),
        (
            np.array([1 + 1j, 1, 1]),
            DESCRIPTOR,
            "{f} must be a 1-D numeric vector, got dtype complex128 shape (3,)",
        ),
        (["a", "b", "c"], DESCRIPTOR, "{f} must be a 1-D numeric vector, got dtype <U1 shape (3,)"),
        (np.array([1.0, np.inf, np.nan]), NON_FINITE, "{f} has 2 NaN/Inf values"),
        (np.ones(5), OVERSIZE, "{f} has 5 dims > cap 4"),
    ],
)
def test_descriptor_vector_reasons(field, value, code, reason):
    ctx = _ctx(limits=Limits(max_descriptor_dims=4))
    desc = Desc(**{field: value})
    _rejected(_vd(desc, ctx), code, "robot 'robot_0': " + reason.format(f=field))


def test_descriptor_vector_that_is_not_an_array():
    class Hostile:
        def __array__(self, *a, **k):
            raise RuntimeError("no")

    _rejected(_vd(Desc(mean=Hostile())), DESCRIPTOR, "robot 'robot_0': mean is not an array")


def test_descriptor_vectors_of_ints_uints_and_lists_accepted_at_the_dims_cap():
    ctx = _ctx(limits=Limits(max_descriptor_dims=3))
    assert _vd(
        Desc(mean=np.array([1, 2, 3], np.int32), variance=np.array([1, 2, 3], np.uint8)), ctx
    )
    assert _vd(Desc(mean=[0.0, 1.0, 2.0], variance=[1.0, 1.0, 1.0]), ctx)
    assert _vd(
        Desc(mean=np.array([1e300, -1e300, 0.0]), variance=np.array([1e-300, 1e300, 1.0])), ctx
    )


def test_descriptor_gaussian_needs_both_vectors_and_positive_variance():
    for over in (dict(mean=None), dict(variance=None), dict(mean=None, variance=None)):
        _rejected(
            _vd(Desc(**over)),
            DESCRIPTOR,
            "robot 'robot_0': gaussian descriptor needs mean and variance",
        )
    _rejected(
        _vd(Desc(variance=np.array([0.5, -2.0, 0.0]))),
        DESCRIPTOR,
        "robot 'robot_0': variance must be > 0, found -2.0",
    )
    _rejected(
        _vd(Desc(variance=np.array([0.5, 0.0, 3.0]))),
        DESCRIPTOR,
        "robot 'robot_0': variance must be > 0, found 0.0",
    )
    _rejected(
        _vd(Desc(variance=np.array([1.0, 2.0]))),
        DESCRIPTOR,
        "robot 'robot_0': mean has 3 dims but variance 2",
    )
    # An empty variance has nothing to be non-positive.
    assert _vd(Desc(kind="update", mean=np.zeros(0), variance=np.zeros(0)))


def test_descriptor_variance_without_mean_is_checked_too():
    _rejected(
        _vd(Desc(kind="update", mean=None, variance=np.array([1.0, -1.0]))),
        DESCRIPTOR,
        "robot 'robot_0': variance must be > 0, found -1.0",
    )
    assert _vd(Desc(kind="update", mean=None, variance=np.array([1.0, 2.0])))


def test_descriptor_announced_dims():
    assert _vd(Desc(), dims=3) and _vd(Desc(), dims=np.int64(3)) and _vd(Desc(), dims=None)
    _rejected(_vd(Desc(), dims=4), DESCRIPTOR, "robot 'robot_0': announced dims 4 but mean has 3")
    _rejected(_vd(Desc(), dims=2), DESCRIPTOR, "robot 'robot_0': announced dims 2 but mean has 3")
    _rejected(_vd(Desc(), dims=-1), MALFORMED, "robot 'robot_0': announced dims -1 is not a count")
    _rejected(
        _vd(Desc(), dims=3.0), MALFORMED, "robot 'robot_0': announced dims 3.0 is not a count"
    )
    _rejected(
        _vd(Desc(), dims=True), MALFORMED, "robot 'robot_0': announced dims True is not a count"
    )
    # No mean: zero dims announced.
    assert _vd(_rnd(), dims=0)
    _rejected(_vd(_rnd(), dims=1), DESCRIPTOR, "robot 'robot_0': announced dims 1 but mean has 0")


def test_descriptor_round_dims():
    ctx = _ctx(descriptor_dims=3)
    assert _vd(Desc(), ctx)
    _rejected(
        _vd(Desc(), _ctx(descriptor_dims=4)),
        DESCRIPTOR,
        "robot 'robot_0': descriptor has 3 dims, expected 4",
    )
    assert _vd(_rnd(), _ctx(descriptor_dims=4))  # no mean: nothing to compare


def test_descriptor_payload_reasons_and_cap():
    ctx = _ctx(limits=Limits(max_descriptor_payload_bytes=4))
    assert _vd(_rnd(payload=b"1234"), ctx) and _vd(_rnd(payload=bytearray(4)), ctx)
    assert _vd(_rnd(payload=memoryview(b"1234")), ctx) and _vd(_rnd(payload=None), ctx)
    _rejected(
        _vd(_rnd(payload=b"12345"), ctx),
        OVERSIZE,
        "robot 'robot_0': descriptor payload of 5 bytes exceeds the cap 4",
    )
    _rejected(
        _vd(_rnd(payload="text")), MALFORMED, "robot 'robot_0': payload is str, expected bytes"
    )
    _rejected(
        _vd(_rnd(payload=[1, 2])), MALFORMED, "robot 'robot_0': payload is list, expected bytes"
    )


def test_descriptor_scores_reasons_and_cap():
    ctx = _ctx(limits=Limits(max_scores=2))
    assert _vd(_rnd(scores={"a": 0.0, "b": np.float32(2.0)}), ctx)
    assert _vd(_rnd(scores={"a": 3, "b": np.int64(1)}), ctx) and _vd(_rnd(scores=None), ctx)
    _rejected(
        _vd(_rnd(scores={"a": 1.0, "b": 1.0, "c": 1.0}), ctx),
        OVERSIZE,
        "robot 'robot_0': 3 scores > cap 2",
    )
    _rejected(
        _vd(_rnd(scores=[("a", 1.0)])),
        MALFORMED,
        "robot 'robot_0': scores must map robot id -> float",
    )
    _rejected(
        _vd(_rnd(scores={"": 1.0})), DESCRIPTOR, "robot 'robot_0': score key '' is not a robot id"
    )
    _rejected(
        _vd(_rnd(scores={3: 1.0})), DESCRIPTOR, "robot 'robot_0': score key 3 is not a robot id"
    )
    for value in (True, "1.0", None, math.nan, math.inf, -0.5):
        _rejected(
            _vd(_rnd(scores={"a": 1.0, "robot_1": value})),
            DESCRIPTOR,
            f"robot 'robot_0': score for 'robot_1' is {value!r}; must be finite and >= 0",
        )


def test_descriptor_residual_std_reasons():
    _rejected(
        _vd(_rnd(residual_std="0.1")),
        MALFORMED,
        "robot 'robot_0': residual_std '0.1' is not a number",
    )
    _rejected(
        _vd(_rnd(residual_std=True)),
        MALFORMED,
        "robot 'robot_0': residual_std True is not a number",
    )
    _rejected(
        _vd(_rnd(residual_std=None)),
        MALFORMED,
        "robot 'robot_0': residual_std None is not a number",
    )
    _rejected(
        _vd(_rnd(residual_std=math.nan)),
        DESCRIPTOR,
        "robot 'robot_0': residual_std nan must be finite and >= 0",
    )
    _rejected(
        _vd(_rnd(residual_std=-1.0)),
        DESCRIPTOR,
        "robot 'robot_0': residual_std -1.0 must be finite and >= 0",
    )
    # Other kinds may omit it (NaN), but a given one must be finite and >= 0 too.
    assert (
        _vd(Desc(residual_std=math.nan))
        and _vd(Desc(residual_std=0.0))
        and _vd(Desc(residual_std=np.float32(2)))
    )
    assert _vd(Desc(residual_std=3)) and _vd(Desc(residual_std=np.int64(3)))
    _rejected(
        _vd(Desc(residual_std=-0.5)),
        DESCRIPTOR,
        "robot 'robot_0': residual_std -0.5 must be finite and >= 0 (or NaN)",
    )
    _rejected(
        _vd(Desc(residual_std=math.inf)),
        DESCRIPTOR,
        "robot 'robot_0': residual_std inf must be finite and >= 0 (or NaN)",
    )
    assert _vd(_rnd(residual_std=0.0)) and _vd(_rnd(residual_std=0))


def test_descriptor_without_residual_attribute_is_nan():
    class Bare:
        robot_id, kind, mean, variance, num_samples = (
            "robot_0",
            "gaussian",
            np.zeros(2),
            np.ones(2),
            3,
        )

    assert _vd(Bare())
    assert digest_of_descriptor(Bare()) == signed_messages.descriptor_digest(
        kind="gaussian", dims=2, mean=np.zeros(2), variance=np.ones(2), num_samples=3
    )


def test_descriptor_exception_is_a_malformed_decision_and_nothing_is_recorded():
    class Boom(Desc):
        @property
        def scores(self):
            raise RuntimeError("broken scores")

        @scores.setter
        def scores(self, value):
            pass

    guard = ReplayGuard()
    guard.advance(3)
    d = _vd(
        Boom(kind="rnd", mean=None, variance=None, residual_std=0.1),
        _ctx(replay_guard=guard),
        nonce=NONCE,
    )
    _rejected(d, MALFORMED, "descriptor could not be validated: RuntimeError: broken scores")
    assert len(guard) == 0


def _signed_desc(desc, round_idx=3, dims=None, nonce=NONCE):
    digest = digest_of_descriptor(desc, dims)
    return dict(
        nonce=nonce, signature=SIGNER.sign_descriptor(round_idx, desc.robot_id, nonce, digest)
    )


def test_descriptor_signature_and_replay():
    ctx = _auth_ctx()
    desc = Desc()
    sig = _signed_desc(desc)
    assert _vd(desc, ctx, commit=False, **sig) and len(ctx.replay_guard) == 0
    assert _vd(desc, ctx, **sig) and len(ctx.replay_guard) == 1
    assert ctx.replay_guard.state()["nonces"] == [[NONCE.hex(), 3]]
    _rejected(
        _vd(desc, ctx, **sig), REPLAY, f"robot 'robot_0': nonce {NONCE.hex()} already used (replay)"
    )
    _rejected(_vd(desc, _auth_ctx()), UNSIGNED, "robot 'robot_0': message is not signed")
    _rejected(
        _vd(Desc(robot_id="robot_7"), _auth_ctx(), **sig),
        UNKNOWN_ROBOT,
        "unknown robot 'robot_7': no public key on the allow-list",
    )
    tampered = Desc(mean=np.array([0.0, 1.0, 2.5]))
    _rejected(
        _vd(tampered, _auth_ctx(), **sig),
        BAD_SIGNATURE,
        "robot 'robot_0': bad signature (64 bytes)",
    )


def test_descriptor_signature_binds_the_announced_dims():
    """The robot signs the dims it announces; with dims given the server hashes int(dims)."""
    desc = Desc()
    ctx = _auth_ctx()
    assert _vd(desc, ctx, dims=np.int64(3), commit=False, **_signed_desc(desc, dims=3))
    assert _vd(desc, ctx, dims=3, commit=False, **_signed_desc(desc))  # default dims = len(mean)
    rnd = _rnd()
    assert _vd(rnd, _auth_ctx(), dims=0, commit=False, **_signed_desc(rnd))
    assert _vd(rnd, _auth_ctx(), commit=False, **_signed_desc(rnd, dims=0))


def test_descriptor_replay_guard_alone_checks_nonces():
    guard = ReplayGuard()
    guard.advance(3)
    ctx = _ctx(replay_guard=guard)
    _rejected(
        _vd(Desc(), ctx, nonce=b"short"), REPLAY, "robot 'robot_0': nonce must be 16 bytes, got 5"
    )
    assert _vd(Desc(), ctx, nonce=NONCE) and len(guard) == 1
    assert _vd(Desc(), ctx, nonce=NONCE).code == REPLAY
    # Without allow-list and guard, neither nonce nor signature is looked at.
    assert _vd(Desc(), _ctx(), nonce="not bytes", signature=None)


def test_descriptor_without_a_nonce_under_replay_protection():
    guard = ReplayGuard()
    guard.advance(3)
    _rejected(
        validate_descriptor(Desc(), _ctx(replay_guard=guard), round_idx=3),
        REPLAY,
        "robot 'robot_0': nonce must be 16 bytes, got 0",
    )


class _Sparse:
    """A descriptor-like object that carries only some attributes (hostile or foreign input)."""

    def __init__(self, **fields):
        self.__dict__.update(fields)


def test_descriptor_missing_attributes_are_treated_as_absent_fields():
    _rejected(
        _vd(_Sparse(robot_id="robot_0", num_samples=3)),
        DESCRIPTOR,
        "robot 'robot_0': descriptor kind None not in ['gaussian', 'rnd', 'update', 'embedding']",
    )
    _rejected(
        _vd(_Sparse(robot_id="robot_0", kind="update")),
        MALFORMED,
        "robot 'robot_0': num_samples None is not an integer",
    )
    # No mean/variance/payload/scores/residual_std: an "update" descriptor may omit them all.
    assert _vd(_Sparse(robot_id="robot_0", kind="update", num_samples=3))
    assert _vd(_Sparse(robot_id="robot_0", kind="update", num_samples=3, mean=np.zeros(2)), dims=2)
    assert _vd(_Sparse(robot_id="robot_0", kind="update", num_samples=3, variance=np.ones(2)))
    _rejected(
        _vd(_Sparse(robot_id="robot_0", kind="gaussian", num_samples=3, mean=np.zeros(2))),
        DESCRIPTOR,
        "robot 'robot_0': gaussian descriptor needs mean and variance",
    )


def test_descriptor_absent_or_empty_payload_is_zero_bytes():
    ctx = _ctx(limits=Limits(max_descriptor_payload_bytes=1))
    assert _vd(_Sparse(robot_id="robot_0", kind="update", num_samples=3), ctx)
    assert (
        _vd(_rnd(payload=b""), ctx)
        and _vd(_rnd(payload=None), ctx)
        and _vd(_rnd(payload=b"x"), ctx)
    )
    assert _vd(_rnd(payload=b"xy"), ctx).code == OVERSIZE


def test_rejected_descriptor_with_commit_records_nothing():
    guard = ReplayGuard()
    guard.advance(3)
    assert not _vd(Desc(kind="magic"), _ctx(replay_guard=guard), nonce=NONCE)
    assert len(guard) == 0


# ------------------------------------------------------------------------------ descriptor digest


def test_digest_of_descriptor_is_the_canonical_digest_of_every_field():
    desc = _rnd(
        mean=np.array([1.0, 2.0]),
        variance=np.array([3.0, 4.0]),
        num_samples=7,
        scores={"b": 2.0, "a": 1.0},
        residual_std=0.25,
        payload=b"pp",
    )
    expected = signed_messages.descriptor_digest(
        kind="rnd",
        dims=2,
        mean=np.array([1.0, 2.0]),
        variance=np.array([3.0, 4.0]),
        num_samples=7,
        payload=b"pp",
        scores={"a": 1.0, "b": 2.0},
        residual_std=0.25,
    )
    assert digest_of_descriptor(desc) == expected and len(expected) == 32
    assert digest_of_descriptor(desc, 2) == expected
    assert digest_of_descriptor(desc, 5) == signed_messages.descriptor_digest(
        kind="rnd",
        dims=5,
        mean=np.array([1.0, 2.0]),
        variance=np.array([3.0, 4.0]),
        num_samples=7,
        payload=b"pp",
        scores={"a": 1.0, "b": 2.0},
        residual_std=0.25,
    )
    # Each field changes the digest.
    for over in (
        dict(kind="gaussian"),
        dict(mean=np.array([1.0, 2.5])),
        dict(variance=np.array([3.0, 4.5])),
        dict(num_samples=8),
        dict(scores={"a": 1.0}),
        dict(residual_std=0.5),
        dict(payload=b"pq"),
    ):
        assert digest_of_descriptor(dataclasses.replace(desc, **over)) != expected, over
    assert digest_of_descriptor(desc, 3) != expected


def test_digest_of_descriptor_defaults_for_absent_fields():
    class Minimal:
        kind, num_samples = "update", 4

    assert digest_of_descriptor(Minimal()) == signed_messages.descriptor_digest(
        kind="update",
        dims=0,
        mean=None,
        variance=None,
        num_samples=4,
        payload=b"",
        scores={},
        residual_std=math.nan,
    )
    none_fields = _rnd(payload=None, scores=None, residual_std=math.nan)
    assert digest_of_descriptor(none_fields) == signed_messages.descriptor_digest(
        kind="rnd",
        dims=0,
        mean=None,
        variance=None,
        num_samples=10,
        payload=b"",
        scores={},
        residual_std=math.nan,
    )
    assert digest_of_descriptor(Desc(mean=np.zeros((2, 2)))) == signed_messages.descriptor_digest(
        kind="gaussian",
        dims=4,
        mean=np.zeros((2, 2)),
        variance=np.array([0.5, 1.0, 2.0]),
        num_samples=10,
    )


def test_digest_of_descriptor_known_bytes():
    """Pinned digest of one descriptor: robots of another build must sign the same bytes."""
    desc = Desc(
        kind="gaussian",
        mean=np.array([1.0]),
        variance=np.array([2.0]),
        num_samples=1,
        residual_std=0.0,
    )
    import hashlib
    import struct

    h = hashlib.sha256()
    h.update(struct.pack("<H", 8) + b"gaussian")
    h.update(struct.pack("<QQ", 1, 1))
    h.update(struct.pack("<q", 1) + np.float32(1.0).tobytes())
    h.update(struct.pack("<q", 1) + np.float32(2.0).tobytes())
    h.update(struct.pack("<Q", 0))
    h.update(struct.pack("<Q", 0))
    h.update(struct.pack("<q", 1) + np.float32(0.0).tobytes())
    assert digest_of_descriptor(desc) == h.digest()


# ============================================================================= audit log


def test_round_counters_defaults():
    c = RoundCounters()
    assert (c.received, c.accepted, c.rejected, c.by_code, c.reasons) == (0, 0, 0, {}, {})
    assert RoundCounters().by_code is not c.by_code


def test_audit_log_defaults_and_argument_checks(tmp_path):
    log = AuditLog()
    assert (log.path, log.keep_rounds, log.fsync, log.max_bytes, log.backups) == (
        None,
        64,
        False,
        8 * MiB,
        1,
    )
    assert AuditLog(keep_rounds=1, max_bytes=1024, backups=0)
    for kw, msg in [
        (dict(keep_rounds=0), "keep_rounds must be >= 1, got 0"),
        (dict(max_bytes=1023), "max_bytes must be >= 1024 and backups >= 0, got 1023, 1"),
        (dict(backups=-1), "max_bytes must be >= 1024 and backups >= 0, got 8388608, -1"),
    ]:
        with pytest.raises(ValueError) as err:
            AuditLog(tmp_path / "x.jsonl", **kw)
        assert str(err.value) == msg
    assert not (tmp_path / "x.jsonl").exists()


def test_audit_log_creates_parent_dirs_and_appends(tmp_path):
    path = tmp_path / "a" / "b" / "audit.jsonl"
    with AuditLog(str(path)) as log:
        assert log.path == path
        log.record(kind="update", robot_id="r1", round_idx=1, decision=ACCEPTED)
    with AuditLog(path) as log:  # reopened: appends, never truncates
        log.record(kind="update", robot_id="r2", round_idx=1, decision=ACCEPTED)
    assert [e["robot_id"] for e in read_audit_log(path)] == ["r1", "r2"]


def test_audit_entry_fields(tmp_path, monkeypatch):
    monkeypatch.setattr(audit_mod.time, "time", lambda: 1700000000.123456789)
    path = tmp_path / "audit.jsonl"
    log = AuditLog(path)
    d = Decision(False, OVERSIZE, "too big")
    assert log.record(kind="update", robot_id="robot_0", round_idx=np.int64(4), decision=d) is d
    # Flushed per line: readable before close.
    (entry,) = read_audit_log(path)
    assert entry == {
        "time": 1700000000.123457,
        "kind": "update",
        "robot_id": "robot_0",
        "round": 4,
        "accepted": False,
        "code": "oversize",
        "reason": "too big",
    }
    log.close()


def test_audit_entry_truncates_every_peer_field(tmp_path):
    path = tmp_path / "audit.jsonl"
    with AuditLog(path) as log:
        log.record(
            kind="k" * 100,
            robot_id="r" * 1000,
            round_idx="x" * 100,
            decision=Decision(False, "c" * 100, "y" * 5000),
        )
        log.record(kind=7, robot_id=None, round_idx=None, decision=ACCEPTED)
        log.record(kind="u", robot_id="r", round_idx=3.5, decision=ACCEPTED)
    first, second, third = read_audit_log(path)
    assert (
        first["kind"] == "k" * 40 and first["robot_id"] == "r" * 255 and first["round"] == "x" * 40
    )
    assert first["code"] == "c" * 40 and first["reason"] == "y" * 1000
    assert (second["kind"], second["robot_id"], second["round"]) == ("7", "None", "None")
    assert third["round"] == "3.5"


def test_audit_extra_fields_kept_truncated_and_bounded(tmp_path):
    path = tmp_path / "audit.jsonl"
    extra = {f"f{i:02d}": i for i in range(20)}
    with AuditLog(path) as log:
        log.record(
            kind="update",
            robot_id="r",
            round_idx=1,
            decision=ACCEPTED,
            n=3,
            x=0.5,
            ok=True,
            none=None,
            big=2**70,
            digest=b"\x00\xff",
            text="t" * 300,
            **{"k" * 50: "v"},
        )
        log.record(kind="update", robot_id="r", round_idx=1, decision=ACCEPTED, **extra)
    first, second = read_audit_log(path)
    assert (first["n"], first["x"], first["ok"], first["none"], first["big"]) == (
        3,
        0.5,
        True,
        None,
        2**70,
    )
    assert (
        first["digest"] == "b'\\x00\\xff'" and first["text"] == "t" * 256 and first["k" * 40] == "v"
    )
    assert [k for k in second if k.startswith("f")] == [
        f"f{i:02d}" for i in range(16)
    ]  # at most 16 extras


def test_audit_extra_fields_cannot_overwrite_the_entry(tmp_path):
    path = tmp_path / "audit.jsonl"
    with AuditLog(path) as log:
        log.record(
            kind="update",
            robot_id="r",
            round_idx=1,
            decision=Decision(False, "late", "why"),
            accepted=True,
            code="ok",
            reason="fine",
            time=0,
            payload_id="p1",
        )
    (entry,) = read_audit_log(path)
    assert (entry["accepted"], entry["code"], entry["reason"]) == (False, "late", "why")
    assert entry["time"] != 0 and entry["payload_id"] == "p1"


def test_audit_entry_with_a_numpy_bool_decision_is_still_written(tmp_path):
    """A decision built from a vectorised check carries numpy.bool_, which json cannot encode
    itself."""
    path = tmp_path / "audit.jsonl"
    with AuditLog(path) as log:
        log.record(
            kind="u", robot_id="r", round_idx=1, decision=Decision(np.bool_(False), "late", "why")
        )
    (entry,) = read_audit_log(path)
    assert (entry["accepted"], entry["code"]) == ("False", "late")
    assert log.counters(1).rejected == 1


def test_audit_lines_are_ascii_json(tmp_path):
    path = tmp_path / "audit.jsonl"
    with AuditLog(path) as log:
        log.record(
            kind="update", robot_id="röbot\n", round_idx=1, decision=Decision(False, "x", "naïve")
        )
    raw = path.read_bytes()
    assert raw.isascii() and raw.count(b"\n") == 1 and b"\\u00f6" in raw
    assert read_audit_log(path)[0]["robot_id"] == "röbot\n"


def test_audit_counters_per_round(tmp_path):
    log = AuditLog()
    reject = Decision(False, LATE, "late " + "z" * 2000)
    for rid, d in [("a", ACCEPTED), ("b", reject), ("a", reject), ("c", ACCEPTED)]:
        log.record(kind="update", robot_id=rid, round_idx=2, decision=d)
    log.record(kind="update", robot_id="a", round_idx=np.int32(3), decision=ACCEPTED)
    log.record(
        kind="update", robot_id="a", round_idx="junk", decision=reject
    )  # no round: no counters
    c = log.counters(2)
    assert (c.received, c.accepted, c.rejected) == (4, 2, 2)
    assert c.by_code == {"ok": 2, "late": 2}
    assert c.reasons == {"a": reject.reason[:1000], "b": reject.reason[:1000], "c": "accepted"}
    assert log.counters(np.int64(3)).received == 1 and log.counters(3).accepted == 1
    # counters() returns a copy.
    c.by_code["ok"] = 99
    c.reasons.clear()
    c.received = 0
    again = log.counters(2)
    assert again.by_code["ok"] == 2 and again.reasons and again.received == 4
    assert log.counters(7) == RoundCounters()


def test_audit_counters_keep_the_newest_rounds():
    log = AuditLog(keep_rounds=2)
    for r in (1, 2):
        log.record(kind="u", robot_id="r", round_idx=r, decision=ACCEPTED)
    assert (
        log.counters(1).received == 1 and log.counters(2).received == 1
    )  # exactly keep_rounds kept
    log.record(
        kind="u", robot_id="r", round_idx=1, decision=ACCEPTED
    )  # an existing round: nothing evicted
    assert log.counters(1).received == 2 and log.counters(2).received == 1
    log.record(kind="u", robot_id="r", round_idx=3, decision=ACCEPTED)  # the first-created (1) goes
    assert (
        log.counters(1).received == 0
        and log.counters(2).received == 1
        and log.counters(3).received == 1
    )


def test_audit_counters_reasons_bounded_at_1024_ids_but_known_ids_still_updated():
    log = AuditLog()
    for i in range(1024):
        log.record(kind="u", robot_id=f"r{i}", round_idx=1, decision=ACCEPTED)
    log.record(kind="u", robot_id="extra", round_idx=1, decision=ACCEPTED)
    log.record(kind="u", robot_id="r0", round_idx=1, decision=Decision(False, "late", "now late"))
    c = log.counters(1)
    assert len(c.reasons) == 1024 and "extra" not in c.reasons and c.reasons["r1023"] == "accepted"
    assert c.reasons["r0"] == "now late" and c.received == 1026
    long_id = "i" * 300
    log.record(kind="u", robot_id=long_id, round_idx=2, decision=ACCEPTED)
    assert list(log.counters(2).reasons) == ["i" * 255]


def _line_len(log_path: Path) -> int:
    return len(log_path.read_text().splitlines()[0]) + 1


def test_audit_rotation_exactly_at_the_cap(tmp_path, monkeypatch):
    monkeypatch.setattr(audit_mod.time, "time", lambda: 1.0)
    path = tmp_path / "audit.jsonl"
    probe = tmp_path / "probe.jsonl"
    with AuditLog(probe) as log:
        log.record(kind="u", robot_id="r", round_idx=1, decision=ACCEPTED, pad="p" * 200)
    n = _line_len(probe)
    assert n * 5 >= 1024
    with AuditLog(path, max_bytes=n * 5, backups=1) as log:
        for _ in range(5):  # exactly max_bytes: still one file
            log.record(kind="u", robot_id="r", round_idx=1, decision=ACCEPTED, pad="p" * 200)
        assert path.stat().st_size == n * 5 and not path.with_name("audit.jsonl.1").exists()
        log.record(
            kind="u", robot_id="r", round_idx=1, decision=ACCEPTED, pad="p" * 200
        )  # n - 1 bytes over
        assert path.with_name("audit.jsonl.1").stat().st_size == n * 5 and path.stat().st_size == n
        for _ in range(4):  # the new file is counted from zero: it fills to exactly max_bytes again
            log.record(kind="u", robot_id="r", round_idx=1, decision=ACCEPTED, pad="p" * 200)
        assert (
            path.stat().st_size == n * 5 and path.with_name("audit.jsonl.1").stat().st_size == n * 5
        )
        assert len(read_audit_log(path.with_name("audit.jsonl.1"))) == 5


def test_audit_file_never_exceeds_max_bytes_by_even_one_byte(tmp_path, monkeypatch):
    monkeypatch.setattr(audit_mod.time, "time", lambda: 1.0)
    path = tmp_path / "audit.jsonl"
    probe = tmp_path / "probe" / "audit.jsonl"
    with AuditLog(probe) as log:
        log.record(kind="u", robot_id="r", round_idx=1, decision=ACCEPTED, pad="p" * 200)
    n = _line_len(probe)
    cap = 6 * n - 1  # a sixth line would overshoot by one byte
    assert cap >= 1024
    with AuditLog(path, max_bytes=cap, backups=1) as log:
        for i in range(30):
            log.record(kind="u", robot_id="r", round_idx=1, decision=ACCEPTED, pad="p" * 200)
            assert path.stat().st_size <= cap, i
    assert path.with_name("audit.jsonl.1").stat().st_size == 5 * n


def test_audit_rotation_survives_the_live_file_removed_underneath(tmp_path):
    """An operator (or a cleanup job) deleting the live log must not crash the next record."""
    path = tmp_path / "audit.jsonl"
    with AuditLog(path, max_bytes=1024, backups=0) as log:
        log.record(kind="u", robot_id="r0", round_idx=1, decision=ACCEPTED, pad="p" * 300)
        path.unlink()
        for i in range(1, 6):
            log.record(kind="u", robot_id=f"r{i}", round_idx=1, decision=ACCEPTED, pad="p" * 300)
    assert read_audit_log(path)[-1]["robot_id"] == "r5" and log.counters(1).received == 6


def test_audit_rotation_counts_what_the_file_held_before(tmp_path, monkeypatch):
    monkeypatch.setattr(audit_mod.time, "time", lambda: 1.0)
    path = tmp_path / "audit.jsonl"
    with AuditLog(path) as log:
        log.record(kind="u", robot_id="r", round_idx=1, decision=ACCEPTED, pad="p" * 200)
    n = path.stat().st_size
    with AuditLog(path, max_bytes=max(1024, 2 * n), backups=1) as log:
        cap = log.max_bytes
        while path.stat().st_size + n <= cap:
            log.record(kind="u", robot_id="r", round_idx=1, decision=ACCEPTED, pad="p" * 200)
        assert not path.with_name("audit.jsonl.1").exists()
        log.record(kind="u", robot_id="r", round_idx=1, decision=ACCEPTED, pad="p" * 200)
        assert path.with_name("audit.jsonl.1").exists() and path.stat().st_size == n


def test_audit_rotation_keeps_backups_in_order_and_drops_the_oldest(tmp_path):
    path = tmp_path / "audit.jsonl"
    with AuditLog(path, max_bytes=1024, backups=2) as log:
        for i in range(40):
            log.record(
                kind="u", robot_id=f"r{i:02d}", round_idx=1, decision=ACCEPTED, pad="p" * 300
            )
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["audit.jsonl", "audit.jsonl.1", "audit.jsonl.2"]
    ids = [
        e["robot_id"]
        for name in ("audit.jsonl.2", "audit.jsonl.1", "audit.jsonl")
        for e in read_audit_log(tmp_path / name)
    ]
    assert ids == [f"r{i:02d}" for i in range(40 - len(ids), 40)]  # newest kept, in order, no gap
    assert all(p.stat().st_size <= 1024 for p in tmp_path.iterdir())
    assert log.counters(1).received == 40


def test_audit_rotation_without_backups_starts_over(tmp_path):
    path = tmp_path / "audit.jsonl"
    with AuditLog(path, max_bytes=1024, backups=0) as log:
        for i in range(10):
            log.record(kind="u", robot_id=f"r{i}", round_idx=1, decision=ACCEPTED, pad="p" * 300)
    assert [p.name for p in tmp_path.iterdir()] == ["audit.jsonl"]
    entries = read_audit_log(path)
    assert entries and entries[-1]["robot_id"] == "r9" and path.stat().st_size <= 1024


def test_audit_fsync_per_line_only_when_asked(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(audit_mod.os, "fsync", lambda fd: calls.append(fd))
    with AuditLog(tmp_path / "a.jsonl") as log:
        log.record(kind="u", robot_id="r", round_idx=1, decision=ACCEPTED)
    assert calls == []
    with AuditLog(tmp_path / "b.jsonl", fsync=True) as log:
        log.record(kind="u", robot_id="r", round_idx=1, decision=ACCEPTED)
        log.record(kind="u", robot_id="r", round_idx=1, decision=ACCEPTED)
        assert len(calls) == 2 and all(isinstance(fd, int) for fd in calls)


def test_audit_close_is_idempotent_and_later_records_only_count(tmp_path):
    path = tmp_path / "audit.jsonl"
    log = AuditLog(path)
    log.record(kind="u", robot_id="r", round_idx=1, decision=ACCEPTED)
    log.close()
    log.close()
    log.record(kind="u", robot_id="r", round_idx=1, decision=ACCEPTED)
    assert len(read_audit_log(path)) == 1 and log.counters(1).received == 2
    with AuditLog() as mem:  # no file at all
        assert mem.record(kind="u", robot_id="r", round_idx=1, decision=ACCEPTED) is ACCEPTED


def test_read_audit_log_skips_torn_and_junk_lines(tmp_path):
    path = tmp_path / "audit.jsonl"
    path.write_text('{"a": 1}\nnot json\n\n{"b": 2}\n{"c": 3', encoding="utf-8")
    assert read_audit_log(path) == [{"a": 1}, {"b": 2}]
    assert read_audit_log(str(path)) == [{"a": 1}, {"b": 2}]
    path.write_text("", encoding="utf-8")
    assert read_audit_log(path) == []


def test_read_audit_log_reads_utf8(tmp_path):
    path = tmp_path / "audit.jsonl"
    path.write_bytes('{"r": "ö"}\n'.encode("utf-8"))
    assert read_audit_log(path) == [{"r": "ö"}]
