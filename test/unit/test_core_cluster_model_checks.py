"""Exact-value checks of the robot-side cluster-model validation
(validation.validate_cluster_model), written against mutants that survived mutmut on validation.py:
each boundary and each reject code, one input at a time (round 0 and cluster -1 accepted,
total_bytes exactly at the cap, the rollback edge, the digest check with and without received bytes,
unsigned vs forged vs malformed signatures, the float32/shape check without a manifest, a crash
turned into MALFORMED).
"""

from __future__ import annotations

import numpy as np
import pytest

from fed_ros.core.security import auth
from fed_ros.core.checks.decisions import (
    BAD_SIGNATURE,
    DIGEST,
    Decision,
    Limits,
    MALFORMED,
    NON_FINITE,
    OK,
    OUT_OF_RANGE,
    OVERSIZE,
    ROLLBACK,
    SCHEMA,
    UNSIGNED,
)
from fed_ros.core.checks.payload_checks import validate_cluster_model
from fed_ros.core.params import manifest_of

SHA = "ab" * 32
MODEL = {"w": np.ones((2, 3), np.float32), "b": np.zeros(3, np.float32)}


def check(**kw) -> Decision:
    args = dict(cluster_id=0, round_idx=0, params=None, expected_manifest=None)
    args.update(kw)
    return validate_cluster_model(**args)


def code(**kw) -> str:
    return check(**kw).code


def test_round_and_cluster_ids_at_their_edges():
    assert (
        check(round_idx=0)
        and check(cluster_id=0)
        and check(cluster_id=-1)
        and check(cluster_id=7, round_idx=3)
    )
    assert code(round_idx=-1) == MALFORMED
    assert code(round_idx=1.0) == MALFORMED and code(cluster_id=1.0) == MALFORMED
    assert code(round_idx=True) == MALFORMED and code(cluster_id=False) == MALFORMED
    assert code(round_idx=np.int64(2)) == OK and code(cluster_id=np.int32(1)) == OK
    reason = check(round_idx=-1).reason
    assert reason.startswith("cluster model: cluster 0 / round -1 must be integers")


def test_total_bytes_boundaries():
    cap = Limits().max_cluster_model_bytes
    assert check(total_bytes=0) and check(total_bytes=cap) and check(total_bytes=None)
    assert code(total_bytes=cap + 1) == OVERSIZE
    assert code(total_bytes=-1) == MALFORMED and code(total_bytes=1.5) == MALFORMED
    assert code(total_bytes=True) == MALFORMED
    small = Limits(max_cluster_model_bytes=100)
    assert check(total_bytes=100, limits=small) and code(total_bytes=101, limits=small) == OVERSIZE
    assert (
        check(total_bytes=101, limits=small).reason
        == "cluster 0 round 0: 101 bytes exceed the cap 100"
    )
    assert check(total_bytes=-1).reason == "cluster 0 round 0: total_bytes -1 is not a size"


def test_rollback_edge():
    assert (
        check(round_idx=5, last_round=5)
        and check(round_idx=6, last_round=5)
        and check(round_idx=0, last_round=0)
    )
    d = check(round_idx=4, last_round=5)
    assert (
        d.code == ROLLBACK
        and d.reason == "cluster 0 round 4: older than the loaded model version 5"
    )


def test_digest_of_the_received_bytes():
    assert check(payload_sha256=SHA, received_sha256=SHA)
    assert check(payload_sha256=SHA)  # header only: nothing received yet
    d = check(payload_sha256=SHA, received_sha256="cd" * 32)
    assert d.accepted is False and d.code == DIGEST
    assert (
        d.reason == "cluster 0 round 0: received bytes hash to 'cdcdcdcdcdcdcdcdcdc..., announced "
        "'abababababababababa..."
    )
    assert code(payload_sha256="", received_sha256="") == OK
    assert check(received_sha256="")  # the announced sha256 defaults to "" (nothing announced)


def test_server_signature_unsigned_forged_and_valid():
    server, other = auth.Signer.generate(), auth.Signer.generate()
    good = server.sign_cluster_model(3, 1, SHA, members=["robot_0"])
    kw = dict(cluster_id=1, round_idx=3, payload_sha256=SHA, members=["robot_0"])
    assert check(**kw, signature=good, server_public_key=server.public_key)
    assert check(
        **kw, signature=b"", server_public_key=None
    )  # no server key configured: not checked
    assert check(**kw, signature=b"junk", server_public_key=None)
    d = check(**kw, signature=b"", server_public_key=server.public_key)
    assert d.code == UNSIGNED and d.reason == "cluster 1 round 3: not signed by the server"
    assert code(**kw, server_public_key=server.public_key) == UNSIGNED  # no signature given at all
    forged = other.sign_cluster_model(3, 1, SHA, members=["robot_0"])
    d = check(**kw, signature=forged, server_public_key=server.public_key)
    assert d.code == BAD_SIGNATURE and d.reason == "cluster 1 round 3: bad server signature"
    # Signed fields: another member list, round or cluster is not the signed model.
    assert (
        code(**{**kw, "members": ["robot_1"]}, signature=good, server_public_key=server.public_key)
        == BAD_SIGNATURE
    )
    assert (
        code(**{**kw, "round_idx": 4}, signature=good, server_public_key=server.public_key)
        == BAD_SIGNATURE
    )
    # The payload header (transfer digest: chunk list, bulk address) is signed too.
    with_header = server.sign_cluster_model(3, 1, SHA, transfer=b"header-v1", members=["robot_0"])
    assert check(
        **kw, transfer=b"header-v1", signature=with_header, server_public_key=server.public_key
    )
    assert (
        code(
            **kw, transfer=b"header-v2", signature=with_header, server_public_key=server.public_key
        )
        == BAD_SIGNATURE
    )
    assert code(**kw, signature=with_header, server_public_key=server.public_key) == BAD_SIGNATURE
    # A sha256 the signing message refuses is malformed, not a crash.
    d = check(
        **{**kw, "payload_sha256": "nothex"}, signature=good, server_public_key=server.public_key
    )
    assert (
        d.code == MALFORMED and d.reason == "cluster 1 round 3: payload sha256 is not hex: 'nothex'"
    )


def test_tensors_with_and_without_the_expected_manifest():
    manifest = manifest_of(MODEL)
    assert check(params=MODEL, expected_manifest=manifest) and check(params=MODEL)
    wrong_shape = {"w": np.ones((3, 2), np.float32), "b": MODEL["b"]}
    assert code(params=wrong_shape, expected_manifest=manifest) == SCHEMA
    assert check(params=wrong_shape)  # no manifest known: any float32 shapes
    f64 = {"w": MODEL["w"].astype(np.float64), "b": MODEL["b"]}
    d = check(params=f64)
    assert (
        d.code == SCHEMA
        and d.reason == "cluster 0 round 0: parameters must be float32 numpy arrays"
    )
    assert code(params={"w": [1.0]}) == SCHEMA and code(params=[MODEL["w"]]) == SCHEMA
    nan = {"w": MODEL["w"].copy(), "b": MODEL["b"]}
    nan["w"][0, 0] = np.nan
    d = check(params=nan)
    assert (
        d.accepted is False and d.code == NON_FINITE and d.reason.startswith("cluster 0 round 0: ")
    )
    assert code(params=nan, expected_manifest=manifest) == NON_FINITE
    big = {"w": MODEL["w"] * 2e6, "b": MODEL["b"]}
    assert (
        code(params=big) == OUT_OF_RANGE
        and code(params=big, expected_manifest=manifest) == OUT_OF_RANGE
    )
    assert check(params=big, limits=Limits(max_abs_value=3e6))


@pytest.mark.parametrize("bad", [{"cluster_id": object()}, {"members": 5}])
def test_a_malformed_model_never_raises(bad):
    server = auth.Signer.generate()
    d = check(**bad, payload_sha256=SHA, signature=b"x" * 64, server_public_key=server.public_key)
    assert not d and d.code in (MALFORMED, BAD_SIGNATURE)


def test_an_exception_inside_the_checks_is_a_malformed_decision_with_its_cause():
    server = auth.Signer.generate()
    d = check(
        payload_sha256=SHA, members=5, signature=b"x" * 64, server_public_key=server.public_key
    )
    assert d.code == MALFORMED
    assert (
        d.reason == "cluster model could not be validated: TypeError: 'int' object is not iterable"
    )
