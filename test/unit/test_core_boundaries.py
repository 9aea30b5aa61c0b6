"""Boundary values of every validator and quorum rule (issue 17, item 4).

Each limit is probed on both sides and at both signs: exactly at the cap (accepted), one step
past it (rejected), the same for the negative extreme, and fractions at k/n and just above or
below it. Where a law exists it is a hypothesis property. Pure, no ROS, runs in the fast tier.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from fed_ros.core.security import auth
from fed_ros.core.security import signed_messages
from fed_ros.core.strategies import robust
from fed_ros.core.checks.decisions import (
    FUTURE,
    LATE,
    Limits,
    MALFORMED,
    NUM_SAMPLES,
    OK,
    OUT_OF_RANGE,
    OVERSIZE,
    ROLLBACK,
    SIZE_MISMATCH,
    STALE_BASE,
)
from fed_ros.core.checks.descriptor_checks import validate_descriptor
from fed_ros.core.checks.payload_checks import check_tensors, validate_cluster_model
from fed_ros.core.checks.sender_checks import ValidationContext
from fed_ros.core.checks.update_checks import UpdateEnvelope, check_update_envelope, validate_update
from fed_ros.core.security.auth import Signer
from fed_ros.core.security.replay import ReplayGuard
from fed_ros.core.params import TensorSpec
from fed_ros.core.rounds.roster import Roster, ready_to_start
from fed_ros.core.rounds.collect import DONE, RoundPlan, StageCollector, TRAIN, quorum_for
from fed_ros.core.rounds.coordinator import RoundCoordinator
from fed_ros.core.rounds.settings import RoundSettings
from fed_ros.core.rounds.store import ModelStore
from fed_ros.core.strategies.base import make_strategy
from fed_ros.core.strategies.types import ClientUpdate

CAP = 1e6  # Limits().max_abs_value
MANIFEST = (TensorSpec("w", (4,)),)
PROPS = settings(max_examples=200, deadline=None, database=None, derandomize=True)


def _params(values) -> dict[str, np.ndarray]:
    return {"w": np.asarray(values, np.float32)}


def _envelope(params, **over) -> UpdateEnvelope:
    payload = params["w"].astype("<f4").tobytes()
    fields = dict(
        robot_id="robot_0",
        round_idx=3,
        base_round=3,
        num_samples=10,
        manifest=MANIFEST,
        total_bytes=len(payload),
        payload_sha256=signed_messages.sha256_hex(payload),
    )
    fields.update(over)
    return UpdateEnvelope(**fields)


def _ctx(**over) -> ValidationContext:
    fields = dict(current_round=3, expected_manifest=MANIFEST)
    fields.update(over)
    return ValidationContext(**fields)


# -------------------------------------------------------------------- value magnitude


@pytest.mark.parametrize("value", [-1e9, -3.4e38, -CAP * 1.0000001])
def test_huge_negative_value_rejected(value):
    d = check_tensors(_params([0.0, value, 0.0, 0.0]), MANIFEST, CAP)
    assert d.code == OUT_OF_RANGE


@pytest.mark.parametrize("value", [1e9, 3.4e38, CAP * 1.0000001])
def test_huge_positive_value_rejected(value):
    d = check_tensors(_params([0.0, value, 0.0, 0.0]), MANIFEST, CAP)
    assert d.code == OUT_OF_RANGE


@pytest.mark.parametrize("value", [-CAP, CAP])
def test_value_exactly_at_the_cap_accepted(value):
    assert check_tensors(_params([value, 0.0, 0.0, 0.0]), MANIFEST, CAP).accepted


@PROPS
@given(hnp.arrays(np.float32, 4, elements=st.floats(-1e8, 1e8, width=32)))
def test_magnitude_law_accepts_iff_every_abs_value_within_cap(arr):
    d = check_tensors({"w": arr}, MANIFEST, CAP)
    assert d.accepted == bool(np.abs(arr).max() <= CAP)


def test_update_with_huge_negative_value_rejected_end_to_end():
    params = _params([1.0, -5e7, 0.0, 0.0])
    d = validate_update(_envelope(params), params, _ctx())
    assert d.code == OUT_OF_RANGE


def test_cluster_model_with_huge_negative_value_rejected_on_the_robot():
    params = _params([1.0, -5e7, 0.0, 0.0])
    d = validate_cluster_model(cluster_id=0, round_idx=1, params=params, expected_manifest=MANIFEST)
    assert d.code == OUT_OF_RANGE


def test_cluster_model_without_manifest_with_huge_negative_value_rejected():
    params = _params([1.0, -5e7, 0.0, 0.0])
    d = validate_cluster_model(cluster_id=0, round_idx=1, params=params, expected_manifest=None)
    assert d.code == OUT_OF_RANGE


# -------------------------------------------------------------------- Limits


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
@pytest.mark.parametrize("bad", [0, -1, -(2**63), True, 1.0])
def test_limits_int_fields_reject_non_positive_and_non_int(name, bad):
    with pytest.raises(ValueError, match=name):
        Limits(**{name: bad})


@pytest.mark.parametrize("name", ["max_update_bytes", "max_num_samples", "max_scores"])
def test_limits_int_fields_accept_one(name):
    assert getattr(Limits(**{name: 1}), name) == 1


@pytest.mark.parametrize("bad", [0.0, -1e-300, -1e6, math.nan, "1"])
def test_limits_max_abs_value_must_be_positive(bad):
    with pytest.raises(ValueError, match="max_abs_value"):
        Limits(max_abs_value=bad)


def test_limits_max_abs_value_accepts_tiny_positive():
    assert Limits(max_abs_value=1e-300).max_abs_value == 1e-300


# -------------------------------------------------------------------- update envelope fields


@pytest.mark.parametrize(
    "n, accepted",
    [
        (-(2**63), False),
        (-1, False),
        (0, False),
        (1, True),
        (100, True),
        (101, False),
        (2**63, False),
    ],
)
def test_num_samples_bounds(n, accepted):
    params = _params([0.0] * 4)
    d = validate_update(
        _envelope(params, num_samples=n), params, _ctx(limits=Limits(max_num_samples=100))
    )
    assert d.accepted == accepted and (accepted or d.code == NUM_SAMPLES)


@pytest.mark.parametrize("cap, accepted", [(16, True), (15, False)])
def test_update_size_cap_is_inclusive(cap, accepted):
    params = _params([0.0] * 4)  # 16 bytes
    d = validate_update(_envelope(params), params, _ctx(limits=Limits(max_update_bytes=cap)))
    assert d.accepted == accepted and (accepted or d.code == OVERSIZE)


@pytest.mark.parametrize(
    "total, code",
    [(-1, MALFORMED), (-(2**62), MALFORMED), (15, SIZE_MISMATCH), (17, SIZE_MISMATCH)],
)
def test_total_bytes_negative_or_off_by_one_rejected(total, code):
    params = _params([0.0] * 4)
    assert check_update_envelope(_envelope(params, total_bytes=total), _ctx()).code == code


@pytest.mark.parametrize(
    "cluster_id, accepted",
    [(-(2**31), False), (-2, False), (-1, True), (0, True), (2**31 - 1, True), (2**31, False)],
)
def test_cluster_id_bounds(cluster_id, accepted):
    params = _params([0.0] * 4)
    d = check_update_envelope(_envelope(params, cluster_id=cluster_id), _ctx())
    assert d.accepted == accepted and (accepted or d.code == MALFORMED)


@pytest.mark.parametrize(
    "base, code", [(-1, MALFORMED), (-(2**40), MALFORMED), (0, OK), (3, OK), (4, STALE_BASE)]
)
def test_base_round_bounds(base, code):
    params = _params([0.0] * 4)
    assert check_update_envelope(_envelope(params, base_round=base), _ctx()).code == code


@pytest.mark.parametrize(
    "round_idx, code", [(-1, MALFORMED), (-(2**40), MALFORMED), (2, LATE), (3, OK), (4, FUTURE)]
)
def test_round_bounds(round_idx, code):
    params = _params([0.0] * 4)
    assert (
        check_update_envelope(_envelope(params, round_idx=round_idx, base_round=0), _ctx()).code
        == code
    )


@pytest.mark.parametrize("robot_id, accepted", [("", False), ("r" * 255, True), ("r" * 256, False)])
def test_robot_id_length_bounds(robot_id, accepted):
    params = _params([0.0] * 4)
    d = check_update_envelope(_envelope(params, robot_id=robot_id), _ctx())
    assert d.accepted == accepted and (accepted or d.code == MALFORMED)


# -------------------------------------------------------------------- descriptors


class _Desc:
    """A descriptor as a hostile message can carry it (no constructor checks)."""

    def __init__(self, **fields):
        self.robot_id, self.kind, self.num_samples = "robot_0", "gaussian", 10
        self.mean, self.variance = np.zeros(3), np.ones(3)
        self.scores, self.residual_std, self.payload = {}, math.nan, b""
        self.__dict__.update(fields)


@pytest.mark.parametrize(
    "variance, accepted",
    [(0.0, False), (-1e-300, False), (-1e300, False), (1e-300, True), (1e300, True)],
)
def test_descriptor_variance_must_be_strictly_positive(variance, accepted):
    d = validate_descriptor(_Desc(variance=np.array([1.0, variance, 1.0])), _ctx(), round_idx=3)
    assert d.accepted == accepted


@pytest.mark.parametrize(
    "score, accepted", [(-1e-300, False), (-1e300, False), (0.0, True), (1e300, True)]
)
def test_descriptor_scores_must_be_non_negative(score, accepted):
    desc = _Desc(kind="rnd", mean=None, variance=None, scores={"robot_1": score}, residual_std=0.1)
    assert validate_descriptor(desc, _ctx(), round_idx=3).accepted == accepted


@pytest.mark.parametrize(
    "residual, accepted", [(-1e-300, False), (-math.inf, False), (0.0, True), (5.0, True)]
)
def test_descriptor_residual_std_must_be_non_negative(residual, accepted):
    desc = _Desc(
        kind="rnd", mean=None, variance=None, scores={"robot_1": 1.0}, residual_std=residual
    )
    assert validate_descriptor(desc, _ctx(), round_idx=3).accepted == accepted


@pytest.mark.parametrize("dims, accepted", [(4, True), (5, False)])
def test_descriptor_dims_cap_is_inclusive(dims, accepted):
    desc = _Desc(mean=np.zeros(dims), variance=np.ones(dims))
    d = validate_descriptor(desc, _ctx(limits=Limits(max_descriptor_dims=4)), round_idx=3)
    assert d.accepted == accepted and (accepted or d.code == OVERSIZE)


@pytest.mark.parametrize("count, accepted", [(2, True), (3, False)])
def test_descriptor_score_count_cap_is_inclusive(count, accepted):
    scores = {f"robot_{i}": 1.0 for i in range(count)}
    desc = _Desc(kind="rnd", mean=None, variance=None, scores=scores, residual_std=0.1)
    d = validate_descriptor(desc, _ctx(limits=Limits(max_scores=2)), round_idx=3)
    assert d.accepted == accepted and (accepted or d.code == OVERSIZE)


@pytest.mark.parametrize("size, accepted", [(8, True), (9, False)])
def test_descriptor_payload_cap_is_inclusive(size, accepted):
    desc = _Desc(payload=b"x" * size)
    d = validate_descriptor(desc, _ctx(limits=Limits(max_descriptor_payload_bytes=8)), round_idx=3)
    assert d.accepted == accepted


@pytest.mark.parametrize("dims", [-1, -(2**40)])
def test_descriptor_negative_announced_dims_rejected(dims):
    assert validate_descriptor(_Desc(), _ctx(), round_idx=3, dims=dims).code == MALFORMED


# -------------------------------------------------------------------- cluster model (robot)


@pytest.mark.parametrize("total, code", [(-1, MALFORMED), (8, OK), (9, OVERSIZE)])
def test_cluster_model_size_cap_is_inclusive_and_negative_is_malformed(total, code):
    d = validate_cluster_model(
        cluster_id=0,
        round_idx=1,
        params=None,
        expected_manifest=None,
        total_bytes=total,
        limits=Limits(max_cluster_model_bytes=8),
    )
    assert d.code == code


@pytest.mark.parametrize("round_idx, code", [(-1, MALFORMED), (4, ROLLBACK), (5, OK), (6, OK)])
def test_cluster_model_round_bounds(round_idx, code):
    d = validate_cluster_model(
        cluster_id=0, round_idx=round_idx, params=None, expected_manifest=None, last_round=5
    )
    assert d.code == code


# -------------------------------------------------------------------- auth (signed fields)

NONCE = b"n" * signed_messages.NONCE_BYTES
DIGEST = "ab" * 32


@pytest.mark.parametrize(
    "round_idx, ok", [(-1, False), (0, True), (2**32 - 1, True), (2**32, False)]
)
def test_signed_round_is_uint32(round_idx, ok):
    if ok:
        assert signed_messages.cluster_model_message(round_idx, 0, DIGEST)
    else:
        with pytest.raises(ValueError, match="round"):
            signed_messages.cluster_model_message(round_idx, 0, DIGEST)


@pytest.mark.parametrize(
    "cluster_id, ok", [(-(2**31) - 1, False), (-(2**31), True), (2**31 - 1, True), (2**31, False)]
)
def test_signed_cluster_id_is_int32(cluster_id, ok):
    if ok:
        assert signed_messages.cluster_model_message(0, cluster_id, DIGEST)
    else:
        with pytest.raises(ValueError, match="cluster id"):
            signed_messages.cluster_model_message(0, cluster_id, DIGEST)


@pytest.mark.parametrize("n, ok", [(-1, False), (0, True), (2**64 - 1, True), (2**64, False)])
def test_signed_num_samples_is_uint64(n, ok):
    call = lambda: signed_messages.update_message(
        0,
        "robot_0",
        NONCE,
        DIGEST,
        base_round=0,
        num_samples=n,  # noqa: E731
        cluster_id=-1,
    )
    if ok:
        assert call()
    else:
        with pytest.raises(ValueError, match="num_samples"):
            call()


@pytest.mark.parametrize(
    "robot_id, ok",
    [
        ("r" * 255, True),
        ("r" * 256, False),
        ("\u00e9" * 127, True),
        ("\u00e9" * 128, False),
        ("", False),
    ],
)
def test_signed_robot_id_is_at_most_255_utf8_bytes(robot_id, ok):
    if ok:
        assert signed_messages.descriptor_message(0, robot_id, NONCE, DIGEST)
    else:
        with pytest.raises(ValueError, match="robot id"):
            signed_messages.descriptor_message(0, robot_id, NONCE, DIGEST)


@pytest.mark.parametrize(
    "size", [signed_messages.NONCE_BYTES - 1, signed_messages.NONCE_BYTES + 1, 0]
)
def test_signed_nonce_length_exact(size):
    with pytest.raises(ValueError, match="nonce"):
        signed_messages.descriptor_message(0, "robot_0", b"n" * size, DIGEST)


@pytest.mark.parametrize("digest", ["ab" * 31, "ab" * 33, b"x" * 31, b"x" * 33])
def test_signed_digest_is_exactly_32_bytes(digest):
    with pytest.raises(ValueError, match="32 bytes"):
        signed_messages.cluster_model_message(0, 0, digest)


def test_signature_verifies_at_the_uint32_round_edge():
    signer = Signer.generate()
    sig = signer.sign_cluster_model(2**32 - 1, -(2**31), DIGEST)
    assert auth.verify_signature(
        signer.public_key, signed_messages.cluster_model_message(2**32 - 1, -(2**31), DIGEST), sig
    )


@pytest.mark.parametrize(
    "kw", [dict(max_nonces=0), dict(max_nonces=-1), dict(window_rounds=0), dict(window_rounds=-5)]
)
def test_replay_guard_settings_reject_non_positive(kw):
    with pytest.raises(ValueError):
        ReplayGuard(**kw)


@pytest.mark.parametrize(
    "window, round_idx, accepted", [(1, 9, False), (1, 10, True), (3, 7, False), (3, 8, True)]
)
def test_replay_guard_window_edge(window, round_idx, accepted):
    guard = ReplayGuard(window_rounds=window)
    guard.advance(10)
    assert (guard.check("robot_0", round_idx, NONCE) is None) == accepted


def test_replay_guard_eviction_at_capacity_raises_the_floor_past_the_evicted_round():
    guard = ReplayGuard(max_nonces=2)
    for i, r in enumerate((1, 2, 3)):
        guard.record("robot_0", r, bytes([i]) * signed_messages.NONCE_BYTES)
    assert len(guard) == 2 and guard.floor == 2


def test_replay_guard_holds_exactly_max_nonces_without_evicting():
    guard = ReplayGuard(max_nonces=2)
    guard.record("robot_0", 1, b"a" * signed_messages.NONCE_BYTES)
    guard.record("robot_0", 2, b"b" * signed_messages.NONCE_BYTES)
    assert len(guard) == 2 and guard.floor == 0


# -------------------------------------------------------------------- quorum


@PROPS
@given(st.integers(1, 400), st.data())
def test_quorum_at_exact_fraction_k_over_n_is_k(n, data):
    k = data.draw(st.integers(1, n))
    assert quorum_for(n, k / n, 1) == k


@PROPS
@given(st.integers(2, 400), st.data())
def test_quorum_just_above_k_over_n_needs_one_more(n, data):
    k = data.draw(st.integers(1, n - 1))
    assert quorum_for(n, k / n + 1e-6, 1) == k + 1


@PROPS
@given(st.integers(1, 400), st.data())
def test_quorum_just_below_k_over_n_is_still_k(n, data):
    k = data.draw(st.integers(1, n))
    assert quorum_for(n, k / n - 1e-6, 1) == k


@PROPS
@given(st.integers(0, 400), st.floats(1e-6, 1.0), st.integers(1, 500))
def test_quorum_is_ceil_law(n, fraction, minimum):
    q = quorum_for(n, fraction, minimum)
    assert q == min(n, max(minimum, math.ceil(fraction * n - 1e-9)))


@pytest.mark.parametrize(
    "n, fraction, expected",
    [(5, 0.5, 3), (7, 0.75, 6), (3, 0.5, 2), (9, 0.5, 5), (4, 0.5, 2), (6, 0.5, 3), (8, 0.75, 6)],
)
def test_quorum_odd_and_even_fleets_round_up(n, fraction, expected):
    assert quorum_for(n, fraction, 1) == expected


@pytest.mark.parametrize("fraction", [0.0, -0.5, -1e-300, 1.0 + 1e-9, 2.0, math.nan])
def test_quorum_fraction_outside_zero_one_rejected(fraction):
    with pytest.raises(ValueError, match="quorum fraction"):
        quorum_for(4, fraction, 1)


@pytest.mark.parametrize("n, expected", [(1, 1), (4, 4), (7, 7)])
def test_quorum_fraction_one_needs_everyone(n, expected):
    assert quorum_for(n, 1.0, 1) == expected


@pytest.mark.parametrize("minimum", [0, -1, -(2**31)])
def test_quorum_minimum_below_one_rejected(minimum):
    with pytest.raises(ValueError, match="minimum quorum"):
        quorum_for(4, 0.5, minimum)


@pytest.mark.parametrize("n", [-1, -(2**31)])
def test_quorum_negative_participants_rejected(n):
    with pytest.raises(ValueError, match="participants"):
        quorum_for(n, 0.5, 1)


def test_quorum_of_no_participants_is_zero():
    assert quorum_for(0, 0.5, 1) == 0


def test_quorum_minimum_above_participants_is_capped_at_all():
    assert quorum_for(3, 0.1, 5) == 3


def test_quorum_minimum_raises_a_small_fraction():
    assert quorum_for(10, 0.1, 4) == 4


# -------------------------------------------------------------------- round settings


@pytest.mark.parametrize(
    "kw, needle",
    [
        (dict(rounds=0), "rounds"),
        (dict(rounds=-1), "rounds"),
        (dict(round_timeout_s=0.0), "round_timeout_s"),
        (dict(round_timeout_s=-1e300), "round_timeout_s"),
        (dict(max_attempts=0), "max_attempts"),
        (dict(max_attempts=-1), "max_attempts"),
        (dict(evaluate_every=-1), "evaluate_every"),
        (dict(eval_timeout_s=0.0), "eval_timeout_s"),
        (dict(eval_timeout_s=-5.0), "eval_timeout_s"),
        (dict(quorum_fraction=0.0), "quorum fraction"),
        (dict(quorum_fraction=1.0000001), "quorum fraction"),
        (dict(min_quorum=0), "minimum quorum"),
    ],
)
def test_round_settings_reject_out_of_range(kw, needle):
    with pytest.raises(ValueError, match=needle):
        RoundSettings(algorithm="fedavg", **{"rounds": 2, **kw})


def test_round_settings_accept_the_smallest_valid_values():
    s = RoundSettings(
        algorithm="fedavg",
        rounds=1,
        quorum_fraction=1e-9,
        min_quorum=1,
        round_timeout_s=1e-9,
        max_attempts=1,
        evaluate_every=0,
        eval_timeout_s=1e-9,
    )
    assert s.rounds == 1 and s.max_attempts == 1


def test_round_settings_accept_fraction_one():
    assert RoundSettings(algorithm="fedavg", rounds=1, quorum_fraction=1.0).quorum_fraction == 1.0


# -------------------------------------------------------------------- collector edges


def _plan(n=3, quorum=2, deadline=10.0) -> RoundPlan:
    ids = tuple(f"robot_{i}" for i in range(n))
    return RoundPlan(
        round_idx=1,
        stage=TRAIN,
        attempt=1,
        deadline_s=deadline,
        algorithm="fedavg",
        participants=ids,
        memberships={r: [(0, 1.0)] for r in ids},
        quorum=quorum,
    )


def test_answer_exactly_at_the_deadline_accepted():
    assert StageCollector(_plan()).check("robot_0", 1, 10.0).accepted


def test_answer_just_after_the_deadline_late():
    assert "late" in StageCollector(_plan()).check("robot_0", 1, 10.0 + 1e-9).reason


def test_collector_still_waits_exactly_at_the_deadline():
    col = StageCollector(_plan())
    col.accept("robot_0", "u")
    assert col.decision(10.0).kind == "wait"


def test_exactly_quorum_answers_proceed_after_the_deadline():
    col = StageCollector(_plan(n=5, quorum=3))
    for rid in ("robot_0", "robot_1", "robot_2"):
        col.accept(rid, "u")
    assert col.decision(10.5).kind == "proceed"


def test_one_below_quorum_abandons_after_the_deadline():
    col = StageCollector(_plan(n=5, quorum=3))
    for rid in ("robot_0", "robot_1"):
        col.accept(rid, "u")
    assert col.decision(10.5).kind == "abandon"


# -------------------------------------------------------------------- coordinator edges


def _initial() -> dict[str, np.ndarray]:
    return {"w": np.zeros(3, np.float32)}


def _update(rid: str, round_idx: int, n: int = 10, value: float = 1.0) -> ClientUpdate:
    upd = ClientUpdate(
        robot_id=rid,
        params={"w": np.full(3, value, np.float32)},
        num_samples=n,
        base_round=round_idx,
    )
    upd.round_idx = round_idx
    return upd


def _coordinator(tmp_path, n=5, rounds=2, fraction=0.5, max_samples=1000, clock=None):
    clock = clock if clock is not None else [0.0]
    settings = RoundSettings(
        algorithm="fedavg",
        rounds=rounds,
        quorum_fraction=fraction,
        round_timeout_s=10.0,
        max_attempts=2,
        max_samples=max_samples,
    )
    coord = RoundCoordinator(
        make_strategy("fedavg"),
        ModelStore(tmp_path / "store"),
        settings,
        _initial(),
        clock=lambda: clock[0],
    )
    for i in range(n):
        assert coord.roster.register(f"robot_{i}").accepted
    return coord, clock


@pytest.mark.parametrize(
    "n, fraction, quorum", [(5, 0.5, 3), (4, 0.5, 2), (7, 0.75, 6), (3, 1.0, 3)]
)
def test_announced_quorum_rounds_up_for_odd_and_even_fleets(tmp_path, n, fraction, quorum):
    coord, _ = _coordinator(tmp_path, n=n, fraction=fraction)
    assert coord.start_round().quorum == quorum


def test_odd_fleet_with_half_its_robots_rounded_down_is_abandoned(tmp_path):
    coord, clock = _coordinator(tmp_path, n=5, fraction=0.5)
    coord.start_round()
    for rid in ("robot_0", "robot_1"):  # 2 of 5: round(2.5) would accept, ceil(2.5) = 3 must not
        assert coord.offer_update(_update(rid, 0)).accepted
    clock[0] = 10.5
    _, outcome = coord.poll()
    assert not outcome.completed and "below quorum" in outcome.status


@pytest.mark.parametrize("n", [0, -1, -(2**40)])
def test_update_with_no_samples_rejected(tmp_path, n):
    coord, _ = _coordinator(tmp_path)
    coord.start_round()
    upd = _update("robot_0", 0)
    upd.num_samples = n  # a hostile header past the constructor
    assert "samples" in coord.offer_update(upd).reason


@pytest.mark.parametrize("n, kept", [(1, 1), (1000, 1000), (1001, 1000), (2**62, 1000)])
def test_update_sample_count_capped_at_max_samples(tmp_path, n, kept):
    coord, _ = _coordinator(tmp_path, max_samples=1000)
    coord.start_round()
    upd = _update("robot_0", 0, n=n)
    assert coord.offer_update(upd).accepted and upd.num_samples == kept


@pytest.mark.parametrize(
    "value, accepted",
    [
        (0.0, True),
        (1.0, True),
        (-1e-9, False),
        (1.0 + 1e-9, False),
        (-1e300, False),
        (math.nan, False),
        (math.inf, False),
    ],
)
def test_success_rate_bounds(tmp_path, value, accepted):
    settings = RoundSettings(algorithm="fedavg", rounds=2, quorum_fraction=0.5, evaluate_every=1)
    coord = RoundCoordinator(
        make_strategy("fedavg"), ModelStore(tmp_path / "s"), settings, _initial(), clock=lambda: 0.0
    )
    coord.roster.register("robot_0")
    coord.start_round()
    coord.offer_update(_update("robot_0", 0))
    coord.poll()  # -> EVALUATE
    assert coord.offer_metrics("robot_0", value).accepted == accepted


@pytest.mark.parametrize("n, accepted", [(-1, False), (-(2**40), False), (0, True)])
def test_roster_sample_count_must_be_non_negative(n, accepted):
    assert Roster().register("robot_0", num_samples=n).accepted == accepted


@pytest.mark.parametrize("n, kept", [(100, 100), (101, 100)])
def test_roster_sample_count_capped(n, kept):
    roster = Roster(max_samples=100)
    roster.register("robot_0", num_samples=n)
    assert roster.get("robot_0").num_samples == kept


def test_roster_full_at_max_robots():
    roster = Roster(max_robots=2)
    assert roster.register("robot_0").accepted and roster.register("robot_1").accepted
    assert "full" in roster.register("robot_2").reason


def test_roster_full_still_accepts_a_known_robot_re_registering():
    roster = Roster(max_robots=1)
    roster.register("robot_0")
    assert roster.register("robot_0").accepted


# -------------------------------------------------------------------- registration timeout


def _ready(
    registered,
    waited_s,
    *,
    expected=("robot_0", "robot_1", "robot_2"),
    min_robots=2,
    timeout=30.0,
    resumed=False,
) -> bool:
    return ready_to_start(
        registered=list(registered),
        expected=list(expected),
        min_robots=min_robots,
        waited_s=waited_s,
        registration_timeout_s=timeout,
        resumed=resumed,
    )


def test_waits_for_the_timeout_when_min_robots_but_not_all_expected_registered():
    assert not _ready(["robot_0", "robot_1"], waited_s=29.0)


def test_starts_with_min_robots_once_the_timeout_passed():
    assert _ready(["robot_0", "robot_1"], waited_s=30.5)


def test_does_not_start_exactly_at_the_timeout():
    assert not _ready(["robot_0", "robot_1"], waited_s=30.0)


def test_does_not_start_below_min_robots_even_after_the_timeout():
    assert not _ready(["robot_0"], waited_s=1e9)


def test_starts_at_once_when_every_expected_robot_registered():
    assert _ready(["robot_0", "robot_1", "robot_2"], waited_s=0.0)


def test_expected_robots_must_be_the_named_ones_not_just_as_many():
    assert not _ready(["robot_0", "robot_1", "robot_9"], waited_s=0.0, min_robots=4)


def test_without_expected_list_starts_once_min_robots_registered():
    assert _ready(["robot_0", "robot_1"], waited_s=0.0, expected=())


def test_without_expected_list_waits_below_min_robots():
    assert not _ready(["robot_0"], waited_s=0.0, expected=())


def test_resumed_server_starts_with_anyone_from_its_roster():
    assert _ready(["robot_0"], waited_s=0.0, resumed=True)


def test_resumed_server_with_an_empty_roster_waits():
    assert not _ready([], waited_s=0.0, resumed=True, expected=(), min_robots=1)


# -------------------------------------------------------------------- restart after the final round


def _run_all_rounds(tmp_path, rounds: int) -> RoundCoordinator:
    coord, _ = _coordinator(tmp_path, n=2, rounds=rounds)
    plan = coord.start_round()
    while plan.stage != DONE:
        for rid in plan.participants:
            assert coord.offer_update(
                _update(rid, plan.round_idx, value=plan.round_idx + 1.0)
            ).accepted
        plan, _ = coord.poll()
    return coord


@pytest.mark.parametrize("rounds", [1, 2])
def test_server_restarted_after_its_final_round_announces_done(tmp_path, rounds):
    _run_all_rounds(tmp_path, rounds)
    settings = RoundSettings(
        algorithm="fedavg", rounds=rounds, quorum_fraction=0.5, round_timeout_s=10.0
    )
    again = RoundCoordinator(
        make_strategy("fedavg"),
        ModelStore(tmp_path / "store"),
        settings,
        _initial(),
        clock=lambda: 0.0,
    )
    assert again.resume()
    plan = again.start_round()
    assert plan.stage == DONE and again.finished and again.collector is None


def test_server_restarted_after_its_final_round_commits_nothing_more(tmp_path):
    _run_all_rounds(tmp_path, rounds=2)
    settings = RoundSettings(
        algorithm="fedavg", rounds=2, quorum_fraction=0.5, round_timeout_s=10.0
    )
    clock = [0.0]
    again = RoundCoordinator(
        make_strategy("fedavg"),
        ModelStore(tmp_path / "store"),
        settings,
        _initial(),
        clock=lambda: clock[0],
    )
    again.resume()
    again.start_round()
    clock[0] = 1e6  # far past any deadline: an open round would close (and commit or abandon) now
    assert again.poll() == (None, None)
    assert ModelStore(tmp_path / "store").load_latest().round_idx == 1


def test_server_restarted_before_its_final_round_trains_the_last_one(tmp_path):
    _run_all_rounds(tmp_path, rounds=1)
    settings = RoundSettings(
        algorithm="fedavg", rounds=2, quorum_fraction=0.5, round_timeout_s=10.0
    )
    again = RoundCoordinator(
        make_strategy("fedavg"),
        ModelStore(tmp_path / "store"),
        settings,
        _initial(),
        clock=lambda: 0.0,
    )
    again.resume()
    plan = again.start_round()
    assert plan.stage == TRAIN and plan.round_idx == 1


# -------------------------------------------------------------------- robust rules


def _stack(rows) -> np.ndarray:
    return np.asarray(rows, np.float32)


@pytest.mark.parametrize("trim", [-1e-9, -0.5, 0.5, 0.5000001, 1.0, math.nan])
def test_trim_outside_zero_half_rejected(trim):
    with pytest.raises(ValueError, match="trim"):
        robust.trimmed_mean(_stack([[0.0], [1.0], [2.0]]), trim)


@pytest.mark.parametrize(
    "trim, expected",
    [(0.0, 25.75), (0.0999, 25.75), (0.1, 19.6875), (0.1999, 19.6875), (0.3, 2.5), (0.4999, 2.5)],
)
def test_trimmed_mean_cut_is_floor_of_trim_times_k(trim, expected):
    # K=10, sorted: -100 1 1 2 2 3 3 4 141.5 200; floor(trim * 10) values cut at each end.
    rows = [[-100.0], [1.0], [2.0], [3.0], [200.0], [1.0], [2.0], [3.0], [4.0], [141.5]]
    assert float(robust.trimmed_mean(_stack(rows), trim)[0]) == pytest.approx(expected)


@pytest.mark.parametrize(
    "n, f, ok",
    [(5, 1, True), (4, 1, False), (3, 0, True), (2, 0, False), (7, 2, True), (6, 2, False)],
)
def test_multi_krum_needs_2f_plus_3(n, f, ok):
    stacked = np.arange(n * 2, dtype=np.float32).reshape(n, 2)
    if ok:
        robust.multi_krum(stacked, np.ones(n), f)
    else:
        with pytest.raises(ValueError, match="2f\\+3"):
            robust.multi_krum(stacked, np.ones(n), f)


@pytest.mark.parametrize("f", [-1, -(2**31)])
def test_multi_krum_negative_f_rejected(f):
    with pytest.raises(ValueError, match="f must be >= 0"):
        robust.multi_krum(np.zeros((5, 2), np.float32), np.ones(5), f)


@pytest.mark.parametrize("m, ok", [(0, False), (-1, False), (1, True), (5, True), (6, False)])
def test_multi_krum_m_bounds(m, ok):
    stacked = np.arange(10, dtype=np.float32).reshape(5, 2)
    if ok:
        assert len(robust.multi_krum(stacked, np.ones(5), 1, m)[1]) == m
    else:
        with pytest.raises(ValueError, match="m must be in"):
            robust.multi_krum(stacked, np.ones(5), 1, m)


@pytest.mark.parametrize("clip", [-1e-9, -1e300, math.inf, -math.inf, math.nan])
def test_clip_norm_negative_or_non_finite_rejected(clip):
    with pytest.raises(ValueError, match="clip_norm"):
        robust.norm_clip_mean(_stack([[1.0, 0.0]]), np.ones(1), clip)


def test_clip_norm_zero_returns_the_reference():
    ref = np.array([3.0, -4.0], np.float32)
    out, _ = robust.norm_clip_mean(
        _stack([[100.0, 100.0], [-1e6, 5.0]]), np.array([0.5, 0.5]), 0.0, ref
    )
    np.testing.assert_array_equal(out, ref)


@PROPS
@given(
    hnp.arrays(np.float32, (4, 3), elements=st.floats(-1e6, 1e6, width=32)), st.floats(0.0, 100.0)
)
def test_clip_bounds_every_clients_offset_law(stacked, clip):
    out, scales = robust.norm_clip_mean(stacked, np.full(4, 0.25), clip)
    assert float(np.linalg.norm(out.astype(np.float64))) <= clip * (1 + 1e-4) + 1e-3
    assert (scales <= 1).all()


@pytest.mark.parametrize(
    "weights", [[-1e-300, 1.0], [-1e300, 1.0], [math.nan, 1.0], [math.inf, 1.0], [0.0, 0.0]]
)
def test_robust_weights_negative_non_finite_or_all_zero_rejected(weights):
    with pytest.raises(ValueError, match="weights"):
        robust.aggregate_robust(_stack([[1.0], [2.0]]), np.asarray(weights), "mean")


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_robust_rule_rejects_non_finite_update(value):
    with pytest.raises(ValueError, match="NaN/Inf"):
        robust.aggregate_robust(_stack([[1.0], [value]]), np.ones(2), "median")


def test_robust_rule_accepts_huge_negative_finite_update():
    out = robust.aggregate_robust(_stack([[-3e38], [-3e38]]), np.ones(2), "median")
    assert float(out[0]) == pytest.approx(-3e38, rel=1e-6)


# -------------------------------------------------------------------- strategy settings


@pytest.mark.parametrize(
    "name, kw",
    [
        ("fedprox", dict(mu=-1e-300)),
        ("fedprox", dict(mu=-math.inf)),
        ("fedprox", dict(mu=math.inf)),
        ("fedprox", dict(mu=math.nan)),
        ("feddrman", dict(num_clusters=0)),
        ("feddrman", dict(num_clusters=-1)),
        ("feddrman", dict(beta=-1e-9)),
        ("feddrman", dict(beta=1.0 + 1e-9)),
        ("feddrman", dict(beta=math.nan)),
        ("feddrman", dict(singleton_intra=-math.inf)),
        ("fedepth", dict(tau=-1e-300)),
        ("fedepth", dict(tau=math.inf)),
        ("fedepth", dict(target_overlap=-1e-9)),
        ("fedepth", dict(target_overlap=1.0 + 1e-9)),
        ("fedepth", dict(recluster_every=-1)),
        ("ifca", dict(num_clusters=0)),
        ("ifca", dict(init_noise=-1e-300)),
        ("ifca", dict(init_noise=math.nan)),
        ("rnd", dict(eps=-1e-300)),
        ("rnd", dict(eps=-math.inf)),
        ("rnd", dict(recluster_every=-1)),
        ("fedavg", dict(robust="mode")),
    ],
)
def test_strategy_settings_out_of_range_rejected(name, kw):
    with pytest.raises(ValueError):
        make_strategy(name, **kw)


@pytest.mark.parametrize(
    "name, kw",
    [
        ("fedprox", dict(mu=0.0)),
        ("feddrman", dict(num_clusters=1, beta=0.0)),
        ("feddrman", dict(beta=1.0)),
        ("fedepth", dict(tau=0.0, target_overlap=0.0, recluster_every=0)),
        ("fedepth", dict(target_overlap=1.0)),
        ("ifca", dict(num_clusters=1, init_noise=0.0)),
        ("rnd", dict(eps=0.0, recluster_every=0)),
    ],
)
def test_strategy_settings_at_the_edge_accepted(name, kw):
    assert make_strategy(name, **kw) is not None


# -------------------------------------------------------------------- robust rules: exact values
# (written against the mutants that survived `make mutation` on robust.py)


@pytest.mark.parametrize(
    "column, expected",
    [
        ([1.0, 2.0, 9.0], 2.0),
        ([1.0, 2.0, 3.0, 10.0], 2.5),
        ([5.0, 1.0, 4.0, 2.0, 3.0], 3.0),
        ([6.0, 1.0, 5.0, 2.0, 4.0, 3.0], 3.5),
        ([7.0, 8.0], 7.5),
        ([4.0], 4.0),
    ],
)
def test_median_of_odd_and_even_counts(column, expected):
    out = robust.aggregate_robust(_stack([[v] for v in column]), np.ones(len(column)), "median")
    assert out.dtype == np.float32 and float(out[0]) == expected


@pytest.mark.parametrize("rule", robust.RULES)
def test_every_rule_returns_float32_from_float64_input(rule):
    stacked = np.arange(15, dtype=np.float64).reshape(5, 3)
    out = robust.aggregate_robust(stacked, np.ones(5), rule)
    assert out.dtype == np.float32 and out.shape == (3,)


@pytest.mark.parametrize("rule", robust.RULES)
def test_every_rule_accepts_zero_parameters(rule):
    assert robust.aggregate_robust(np.zeros((5, 0), np.float32), np.ones(5), rule).shape == (0,)


def test_rule_rejects_no_updates():
    with pytest.raises(ValueError, match="K >= 1"):
        robust.aggregate_robust(np.zeros((0, 3), np.float32), np.ones(0), "mean")


def test_rule_accepts_a_single_update():
    np.testing.assert_array_equal(
        robust.aggregate_robust(_stack([[1.0, 2.0]]), np.ones(1), "mean"), [1.0, 2.0]
    )


def test_weight_count_mismatch_named():
    with pytest.raises(ValueError, match="^3 weights for 2 updates$"):
        robust.aggregate_robust(_stack([[1.0], [2.0]]), np.ones(3), "mean")


def test_unknown_rule_and_setting_rejected_with_reason():
    with pytest.raises(ValueError, match="unknown robust rule 'mode'"):
        robust.aggregate_robust(_stack([[1.0]]), np.ones(1), "mode")
    with pytest.raises(ValueError, match=r"rule 'median' does not take \['trim'\]"):
        robust.aggregate_robust(_stack([[1.0]]), np.ones(1), "median", trim=0.1)


def test_non_finite_update_index_named():
    with pytest.raises(ValueError, match="^update 1 holds NaN/Inf values$"):
        robust.aggregate_robust(_stack([[1.0], [math.nan], [2.0]]), np.ones(3), "mean")


def test_zero_weight_is_allowed_and_ignored():
    out = robust.aggregate_robust(_stack([[100.0], [2.0]]), np.array([0.0, 1.0]), "mean")
    assert float(out[0]) == 2.0


def test_weights_summing_below_one_are_normalised():
    out = robust.aggregate_robust(_stack([[1.0], [3.0]]), np.array([0.25, 0.25]), "mean")
    assert float(out[0]) == 2.0


def test_trimmed_mean_default_trim_is_a_tenth():
    rows = [[-100.0], [1.0], [2.0], [3.0], [200.0], [1.0], [2.0], [3.0], [4.0], [141.5]]
    assert float(robust.aggregate_robust(_stack(rows), np.ones(10), "trimmed_mean")[0]) == 19.6875


def test_trimmed_mean_setting_is_passed_through():
    rows = [[-100.0], [1.0], [2.0], [3.0], [200.0], [1.0], [2.0], [3.0], [4.0], [141.5]]
    assert (
        float(robust.aggregate_robust(_stack(rows), np.ones(10), "trimmed_mean", trim=0.3)[0])
        == 2.5
    )


@pytest.mark.parametrize("trim", [0.0, 0.1])
def test_trimmed_mean_accumulates_in_float64(trim):
    rows = [[3e38]] * 10  # a float32 sum of these overflows
    assert float(robust.trimmed_mean(_stack(rows), trim)[0]) == pytest.approx(3e38, rel=1e-6)


def test_krum_scores_sum_squared_distances_to_the_n_minus_f_minus_2_nearest():
    points = _stack([[0.0], [0.1], [0.3], [0.6], [5.0]])
    # f = 1: each point sums its 2 nearest squared distances.
    expected = [0.01 + 0.09, 0.01 + 0.04, 0.04 + 0.09, 0.09 + 0.25, 19.36 + 22.09]
    np.testing.assert_allclose(robust.krum_scores(points, 1), expected, rtol=1e-5)


def test_multi_krum_default_f_is_one_and_m_is_passed_through():
    stacked = _stack([[0.0], [0.1], [0.3], [0.6], [5.0]])
    default = robust.aggregate_robust(stacked, np.ones(5), "multi_krum")
    np.testing.assert_array_equal(default, robust.multi_krum(stacked, np.ones(5) / 5, 1)[0])
    chosen = robust.aggregate_robust(stacked, np.ones(5), "multi_krum", f=1, m=1)
    assert float(chosen[0]) == pytest.approx(0.1)  # the lowest score alone


def test_multi_krum_f_setting_is_passed_through():
    stacked = np.arange(14, dtype=np.float32).reshape(7, 2)
    with pytest.raises(ValueError, match="n=7, f=3 \\(need >= 9\\)"):
        robust.aggregate_robust(stacked, np.ones(7), "multi_krum", f=3)


def test_multi_krum_weights_the_chosen_updates():
    stacked = _stack([[0.0], [0.1], [0.3], [0.6], [5.0]])
    out, chosen = robust.multi_krum(stacked, np.array([1.0, 3.0, 1.0, 1.0, 1.0]), 1, 2)
    assert chosen == [0, 1] and float(out[0]) == pytest.approx(0.075)


def test_multi_krum_with_zero_weights_on_the_chosen_falls_back_to_their_mean():
    stacked = _stack([[0.0], [0.1], [0.3], [0.6], [5.0]])
    out, _ = robust.multi_krum(stacked, np.array([0.0, 0.0, 1.0, 1.0, 1.0]), 1, 2)
    assert float(out[0]) == pytest.approx(0.05)


def test_adaptive_clip_uses_the_median_update_norm():
    stacked = _stack([[1.0, 0.0], [0.0, 2.0], [10.0, 0.0]])
    _, scales = robust.norm_clip_mean(stacked, np.ones(3) / 3)
    np.testing.assert_allclose(scales, [1.0, 1.0, 0.2])


def test_clip_measures_offsets_from_the_reference():
    ref = np.array([10.0, 10.0], np.float64)  # a float64 reference is accepted
    out = robust.aggregate_robust(
        _stack([[13.0, 14.0], [10.0, 10.0]]), np.ones(2), "clip", clip_norm=1.0, reference=ref
    )
    np.testing.assert_allclose(out, [10.3, 10.4], rtol=1e-6)


def test_clip_keeps_tiny_updates_unscaled():
    _, scales = robust.norm_clip_mean(_stack([[1e-3, 0.0]]), np.ones(1), 0.5)
    assert scales[0] == 1.0


def test_clip_rejects_a_reference_of_the_wrong_shape():
    with pytest.raises(ValueError, match=r"reference has shape \(3,\), expected \(2,\)"):
        robust.norm_clip_mean(_stack([[1.0, 0.0]]), np.ones(1), 1.0, np.zeros(3))


def test_all_zero_weights_named():
    with pytest.raises(ValueError, match="^weights sum to 0$"):
        robust.aggregate_robust(_stack([[1.0], [2.0]]), np.zeros(2), "mean")


def test_multi_krum_weights_summing_below_one_are_kept_not_replaced_by_uniform():
    stacked = _stack([[0.0], [0.1], [0.3], [0.6], [5.0]])
    out, _ = robust.multi_krum(stacked, np.array([0.1, 0.3, 0.2, 0.2, 0.2]), 1, 2)
    assert float(out[0]) == pytest.approx(0.075)


def test_trimmed_mean_with_a_cut_returns_float32():
    assert (
        robust.trimmed_mean(np.arange(10, dtype=np.float32).reshape(10, 1), 0.2).dtype == np.float32
    )


def test_robust_defaults_are_the_weighted_mean_and_a_ten_percent_trim():
    """The defaults a caller gets without naming them: rule "mean" (the weighted average)
    and trim 0.1 (with K = 10, one smallest and one largest value per coordinate dropped)."""
    stacked = np.arange(10, dtype=np.float32)[:, None] * np.ones((1, 3), np.float32)
    stacked[9] = 1000.0  # an outlier the trimmed mean drops and the mean does not
    weights = np.arange(1, 11, dtype=np.float64)
    expected_mean = (weights[:, None] * stacked).sum(0) / weights.sum()
    np.testing.assert_allclose(robust.aggregate_robust(stacked, weights), expected_mean, rtol=1e-6)
    np.testing.assert_allclose(
        robust.trimmed_mean(stacked), np.full(3, np.mean(np.arange(1, 9))), rtol=1e-6
    )
