"""Authenticated registration (issue 13): proof of possession of the allow-listed key over
(claim, timestamp, nonce); unknown ids, wrong keys, forged, stale and replayed requests refused
with a reason; capabilities change only with the key. Pure, no ROS, fake clock."""

from __future__ import annotations

import dataclasses

import pytest

from fed_ros.core.security.auth import AllowList, Signer
from fed_ros.core.security.registration import (
    RegistrationClaim,
    RegistrationGuard,
    sign_registration,
)
from fed_ros.core.rounds.roster import Roster

S = 1_000_000_000  # ns per s
T0 = 1_800_000_000 * S


@pytest.fixture(scope="module")
def keys():
    return {"robot_0": Signer.generate(), "robot_1": Signer.generate(), "thief": Signer.generate()}


def _guard(keys, clock, **kw) -> RegistrationGuard:
    allow = AllowList(
        {"robot_0": keys["robot_0"].public_key, "robot_1": keys["robot_1"].public_key}
    )
    return RegistrationGuard(allow, window_s=30.0, clock_ns=lambda: clock[0], **kw)


def _claim(keys, rid="robot_0", **kw) -> RegistrationClaim:
    return RegistrationClaim(
        robot_id=rid,
        public_key=keys[rid].public_key,
        tasks=("lift",),
        action_dim=4,
        num_samples=100,
        **kw,
    )


def _check(guard, claim, proof):
    return guard.check(claim, proof.timestamp_ns, proof.nonce, proof.signature)


def test_valid_proof_accepted_once_and_replay_refused(keys):
    clock = [T0]
    guard = _guard(keys, clock)
    claim = _claim(keys)
    proof = sign_registration(keys["robot_0"], claim, timestamp_ns=T0)
    assert _check(guard, claim, proof) is None
    why = _check(guard, claim, proof)
    assert why is not None and "already used (replay)" in why


def test_unknown_id_wrong_key_unsigned_and_forged_refused_with_reason(keys):
    clock = [T0]
    guard = _guard(keys, clock)
    intruder = RegistrationClaim(robot_id="intruder_7", public_key=keys["thief"].public_key)
    assert "not on the allow-list" in _check(
        guard, intruder, sign_registration(keys["thief"], intruder, T0)
    )
    # The thief presents its own key under a real id: wrong key.
    wrong = dataclasses.replace(_claim(keys), public_key=keys["thief"].public_key)
    assert "does not match the allow-list" in _check(
        guard, wrong, sign_registration(keys["thief"], wrong, T0)
    )
    # The thief knows robot_0's PUBLIC key but signs with its own: bad signature.
    claim = _claim(keys)
    forged = sign_registration(keys["thief"], claim, T0)
    assert "bad signature" in _check(guard, claim, forged)
    unsigned = dataclasses.replace(sign_registration(keys["robot_0"], claim, T0), signature=b"")
    assert "not signed" in _check(guard, claim, unsigned)
    assert len(guard) == 0  # refused senders leave no state behind


def test_capabilities_change_only_with_the_key(keys):
    """A valid proof for robot_0's claim cannot be re-used with other capabilities."""
    clock = [T0]
    guard = _guard(keys, clock)
    claim = _claim(keys)
    proof = sign_registration(keys["robot_0"], claim, T0)
    for change in (
        dict(tasks=("stack",)),
        dict(num_samples=10**6),
        dict(has_gpu=True),
        dict(action_dim=7),
        dict(cameras=("wrist",)),
    ):
        assert "bad signature" in _check(guard, dataclasses.replace(claim, **change), proof), change
    assert _check(guard, claim, proof) is None


def test_stale_or_future_timestamps_refused(keys):
    clock = [T0]
    guard = _guard(keys, clock)
    claim = _claim(keys)
    old = sign_registration(keys["robot_0"], claim, T0 - 31 * S)
    assert "stamped -31.0 s" in _check(guard, claim, old)
    ahead = sign_registration(keys["robot_0"], claim, T0 + 31 * S)
    assert "replayed, or clocks out of sync" in _check(guard, claim, ahead)
    assert _check(guard, claim, sign_registration(keys["robot_0"], claim, T0 - 29 * S)) is None


def test_nonce_memory_is_bounded_and_an_evicted_nonce_cannot_be_replayed(keys):
    clock = [T0]
    guard = _guard(keys, clock, max_nonces=3)
    claim = _claim(keys)
    proofs = [sign_registration(keys["robot_0"], claim, T0 + i) for i in range(5)]
    for p in proofs:
        assert _check(guard, claim, p) is None
    assert len(guard) == 3
    assert _check(guard, claim, proofs[0]) is not None  # evicted: refused by the raised floor
    clock[0] = T0 + 100 * S  # everything outside the window: forgotten
    assert _check(guard, claim, sign_registration(keys["robot_0"], claim, clock[0])) is None
    assert len(guard) == 1


def test_guard_then_roster_is_the_server_path(keys):
    """What the server does: the guard proves possession, then the allow-list roster admits."""
    clock = [T0]
    guard = _guard(keys, clock)
    roster = Roster(allowed_keys={"robot_0": keys["robot_0"].public_key})
    claim = _claim(keys)
    assert _check(guard, claim, sign_registration(keys["robot_0"], claim, T0)) is None
    assert roster.register(
        claim.robot_id,
        tasks=claim.tasks,
        num_samples=claim.num_samples,
        public_key=claim.public_key,
    ).accepted
    assert roster.get("robot_0").tasks == ("lift",)
