"""F1: 10,000 hypothesis-generated malformed messages into each handler: no crash, no state change.

Handlers: the server's update and descriptor validation (`validate_update`,
`validate_descriptor`), the robot's cluster-model validation (`validate_cluster_model`), the
message conversion `descriptor_from_msg`, the transport's `PayloadAssembler.add`, and the
server's round logic (`RoundCoordinator.offer_update` / `offer_descriptor`). Every example
carries at least one defect, so each must be rejected; the replay guard, the collected answers,
the cluster models and the checkpoint directory must be byte-identical afterwards.
``FED_ROS_FUZZ_EXAMPLES`` lowers the count for a quick local run (default 10,000).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from fed_ros.core.security import signed_messages
from fed_ros.core.checks.decisions import Decision, Limits, OK
from fed_ros.core.checks.descriptor_checks import (
    DESCRIPTOR_KINDS,
    digest_of_descriptor,
    validate_descriptor,
)
from fed_ros.core.checks.payload_checks import validate_cluster_model
from fed_ros.core.checks.sender_checks import ValidationContext
from fed_ros.core.checks.update_checks import UpdateEnvelope, validate_update
from fed_ros.core.security.auth import AllowList, Signer
from fed_ros.core.security.replay import ReplayGuard
from fed_ros.core.params import TensorSpec

MESSAGES = int(os.environ.get("FED_ROS_FUZZ_EXAMPLES", "10000"))
# Each hypothesis example carries BATCH messages: per-example engine overhead (~1 ms) would
# otherwise dominate the handlers' own cost (~0.1 ms) and blow the test-time budget.
BATCH = 10
FUZZ = settings(
    max_examples=max(1, MESSAGES // BATCH),
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)


def batch(*strategies):
    """BATCH independent draws of a tuple of strategies (one message each)."""
    return st.lists(st.tuples(*strategies), min_size=BATCH, max_size=BATCH)


MANIFEST = (
    TensorSpec("a.weight", (4, 3)),
    TensorSpec("a.bias", (4,)),
    TensorSpec("b.weight", (2, 4)),
)
SIZES = [12, 4, 8]
SIGNERS = {f"robot_{i}": Signer.generate() for i in range(3)}
ALLOW = AllowList({rid: s.public_key for rid, s in SIGNERS.items()})

# float32 values that matter to validation (cheaper to draw than st.floats()).
F32 = st.sampled_from(
    [0.0, -0.0, 1.0, -1.0, 0.25, 1e-45, 3.4e38, -3.4e38, math.inf, -math.inf, math.nan]
)

# Arbitrary Python values for "type chaos" (what a buggy converter could hand over).
ANY = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True),
    st.text(max_size=8),
    st.binary(max_size=8),
    st.lists(st.integers(-3, 3), max_size=3),
)


def good_params() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {s.name: rng.normal(size=s.shape).astype(np.float32) for s in MANIFEST}


def payload(params) -> bytes:
    return b"".join(a.astype("<f4").tobytes() for a in params.values())


def good_envelope(params, nonce: bytes | None = None) -> UpdateEnvelope:
    data = payload(params)
    env = UpdateEnvelope(
        robot_id="robot_0",
        round_idx=5,
        base_round=4,
        num_samples=100,
        manifest=MANIFEST,
        total_bytes=len(data),
        payload_sha256=signed_messages.sha256_hex(data),
        nonce=nonce or signed_messages.new_nonce(),
    )
    return env.signed(SIGNERS["robot_0"])


def make_ctx() -> ValidationContext:
    guard = ReplayGuard()
    guard.advance(5)
    return ValidationContext(
        current_round=5,
        expected_manifest=MANIFEST,
        base_rounds={4},
        participants=set(SIGNERS),
        limits=Limits(max_update_bytes=1 << 16, max_num_samples=10_000),
        allow_list=ALLOW,
        replay_guard=guard,
    )


# ------------------------------------------------------------------ server: updates

UPDATE_DEFECTS = (
    "late",
    "future",
    "deadline",
    "not_participant",
    "unknown_robot",
    "oversize",
    "size_mismatch",
    "manifest_name",
    "manifest_shape",
    "manifest_dtype",
    "manifest_len",
    "samples_low",
    "samples_high",
    "base_round",
    "cluster_id",
    "forged",
    "unsigned",
    "sig_bits",
    "replay",
    "digest",
    "nan",
    "inf",
    "huge",
    "t_missing",
    "t_extra",
    "t_shape",
    "t_dtype",
    "t_order",
    "t_type",
    "chaos",
    "encoding",
    "reweighted",
)
ENVELOPE_FIELDS = [f.name for f in dataclasses.fields(UpdateEnvelope)]


@pytest.fixture(scope="module")
def update_world():
    ctx = make_ctx()
    params = good_params()
    used = good_envelope(params)
    assert validate_update(used, params, ctx)  # its nonce is now spent: replaying it is a defect
    return ctx, params, used


def _defective_update(
    defect: str, params, used: UpdateEnvelope, ctx, i: int, x: float, chaos, field: str
):
    """A (envelope, params, received_sha256, ctx) tuple with `defect` applied to a valid update."""
    env = good_envelope(params)
    p = {k: v.copy() for k, v in params.items()}
    received = env.payload_sha256
    c = ctx
    resign = True
    if defect == "late":
        env = dataclasses.replace(env, round_idx=i % 5)
    elif defect == "future":
        env = dataclasses.replace(env, round_idx=6 + i)
    elif defect == "deadline":
        c = dataclasses.replace(ctx, deadline_passed=True)
    elif defect == "not_participant":
        c = dataclasses.replace(ctx, participants={"robot_1"})
    elif defect == "unknown_robot":
        env = dataclasses.replace(env, robot_id=f"intruder_{i}")
    elif defect == "oversize":
        env = dataclasses.replace(env, total_bytes=(1 << 16) + 1 + i)
    elif defect == "size_mismatch":
        env = dataclasses.replace(env, total_bytes=(env.total_bytes + 1 + i) % (1 << 16))
    elif defect == "manifest_name":
        env = dataclasses.replace(env, manifest=(TensorSpec("x" + str(i), (4, 3)),) + MANIFEST[1:])
    elif defect == "manifest_shape":
        env = dataclasses.replace(
            env, manifest=(("a.weight", (3, 4 + i), "float32"),) + MANIFEST[1:]
        )
    elif defect == "manifest_dtype":
        env = dataclasses.replace(
            env, manifest=(("a.weight", (4, 3), ["float16", "int8", ""][i % 3]),) + MANIFEST[1:]
        )
    elif defect == "manifest_len":
        env = dataclasses.replace(env, manifest=MANIFEST[: i % 3])
    elif defect == "samples_low":
        env = dataclasses.replace(env, num_samples=-(i % 3))
    elif defect == "samples_high":
        env = dataclasses.replace(env, num_samples=10_001 + i)
    elif defect == "base_round":
        env = dataclasses.replace(env, base_round=[3, 5, 0, 2**31][i % 4])
    elif defect == "cluster_id":
        env = dataclasses.replace(env, cluster_id=-2 - i)
    elif defect == "forged":
        env = env.signed(Signer.generate())
        resign = False
    elif defect == "unsigned":
        env, resign = dataclasses.replace(env, signature=b""), False
    elif defect == "sig_bits":
        sig = bytearray(env.signature)
        sig[i % 64] ^= 1 << (i % 8)
        env, resign = dataclasses.replace(env, signature=bytes(sig)), False
    elif defect == "replay":
        env, resign = used, False
    elif defect == "digest":
        received = hashlib.sha256(str(i).encode()).hexdigest()
    elif defect in ("nan", "inf", "huge"):
        name = MANIFEST[i % 3].name
        p[name].reshape(-1)[i % p[name].size] = {"nan": np.nan, "inf": -np.inf, "huge": 1e30}[
            defect
        ]
    elif defect == "t_missing":
        del p[MANIFEST[i % 3].name]
    elif defect == "t_extra":
        p["zzz"] = np.zeros(1, np.float32)
    elif defect == "t_shape":
        p["a.bias"] = np.zeros(4 + 1 + i % 5, np.float32)
    elif defect == "t_dtype":
        p["a.bias"] = p["a.bias"].astype([np.float64, np.float16, np.int32][i % 3])
    elif defect == "t_order":
        p = dict(reversed(list(p.items())))
    elif defect == "t_type":
        p["a.bias"] = chaos
    elif defect == "chaos":
        original = getattr(env, field)
        if field == "cluster_id" and isinstance(chaos, int) and -1 <= chaos < 2**31:
            chaos = (
                -5
            )  # another valid cluster id is no defect (and would fail the signature anyway)
        if type(chaos) is type(original) and chaos == original:
            chaos = None  # the unchanged value is no defect
        env = dataclasses.replace(env, **{field: chaos})
        resign = False  # the signature was made over the original fields
    elif defect == "encoding":
        env = dataclasses.replace(env, encoding=[1, 2, 3, -1, 255][i % 5])
    elif defect == "reweighted":  # genuine signature, sample count changed in transit
        env, resign = (
            dataclasses.replace(env, num_samples=1 + i % 9_999 if i % 9_999 + 1 != 100 else 7),
            False,
        )
    if (
        resign
        and isinstance(env.robot_id, str)
        and env.robot_id in SIGNERS
        and defect not in ("digest",)
    ):
        try:
            env = env.signed(
                SIGNERS[env.robot_id]
            )  # the defect is in the content, not the signature
        except ValueError:
            pass
    return env, p, received, c


@FUZZ
@given(
    cases=batch(
        st.sampled_from(UPDATE_DEFECTS),
        st.integers(0, 10_000),
        st.floats(),
        ANY,
        st.sampled_from(ENVELOPE_FIELDS),
    )
)
def test_f1_update_handler(update_world, cases):
    for case in cases:
        _one_update(update_world, *case)


def _one_update(update_world, defect, i, x, chaos, field):
    ctx, params, used = update_world
    guard_before = ctx.replay_guard.state()
    env, p, received, c = _defective_update(defect, params, used, ctx, i, x, chaos, field)
    d = validate_update(env, p, c, received_sha256=received)
    assert isinstance(d, Decision) and not d.accepted, (defect, d)
    assert d.reason and d.code != OK
    assert ctx.replay_guard.state() == guard_before
    assert ctx.expected_manifest == MANIFEST


# ------------------------------------------------------------------ server: descriptors


@dataclasses.dataclass
class RawDescriptor:
    robot_id: object
    kind: object
    mean: object = None
    variance: object = None
    num_samples: object = 0
    scores: object = dataclasses.field(default_factory=dict)
    residual_std: object = math.nan
    payload: object = b""


DESCRIPTOR_DEFECTS = (
    "var_zero",
    "var_neg",
    "mean_nan",
    "var_inf",
    "dims",
    "len_mismatch",
    "samples_high",
    "samples_zero",
    "kind",
    "payload_big",
    "score_neg",
    "score_nan",
    "score_key",
    "residual",
    "forged",
    "unsigned",
    "replay",
    "late",
    "unknown",
    "chaos",
    "ndim",
    "dtype",
)
DESCRIPTOR_FIELDS = [f.name for f in dataclasses.fields(RawDescriptor)]


def good_descriptor() -> RawDescriptor:
    return RawDescriptor(
        robot_id="robot_1",
        kind="gaussian",
        mean=np.linspace(-1, 1, 6).astype(np.float32),
        variance=np.full(6, 0.25, np.float32),
        num_samples=500,
    )


def sign_desc(desc, round_idx=5, nonce=None, signer=None):
    nonce = nonce or signed_messages.new_nonce()
    digest = digest_of_descriptor(desc)
    sig = (signer or SIGNERS["robot_1"]).sign_descriptor(round_idx, "robot_1", nonce, digest)
    return dict(round_idx=round_idx, nonce=nonce, signature=sig)


@pytest.fixture(scope="module")
def descriptor_world():
    ctx = make_ctx()
    ctx.limits = Limits(max_num_samples=10_000, max_descriptor_payload_bytes=256, max_scores=8)
    desc = good_descriptor()
    used = sign_desc(desc)
    assert validate_descriptor(desc, ctx, dims=6, **used)
    return ctx, used


@FUZZ
@given(
    cases=batch(
        st.sampled_from(DESCRIPTOR_DEFECTS),
        st.integers(0, 10_000),
        ANY,
        st.sampled_from(DESCRIPTOR_FIELDS),
    )
)
def test_f1_descriptor_handler(descriptor_world, cases):
    for case in cases:
        _one_descriptor(descriptor_world, *case)


def _one_descriptor(descriptor_world, defect, i, chaos, field):
    ctx, used = descriptor_world
    guard_before = ctx.replay_guard.state()
    desc = good_descriptor()
    dims = 6
    sign_kw: dict = {}
    c = ctx
    k = i % 6
    if defect == "var_zero":
        desc.variance[k] = 0.0
    elif defect == "var_neg":
        desc.variance[k] = -abs(float(i)) - 1e-3
    elif defect == "mean_nan":
        desc.mean[k] = np.nan
    elif defect == "var_inf":
        desc.variance[k] = np.inf
    elif defect == "dims":
        dims = 7 + i
    elif defect == "len_mismatch":
        desc.variance = desc.variance[:k]
    elif defect == "samples_high":
        desc.num_samples = 10_001 + i
    elif defect == "samples_zero":
        desc.num_samples = -(i % 2)
    elif defect == "kind":
        desc.kind = ["GAUSSIAN", "", "rnd2", "pickle"][i % 4]
    elif defect == "payload_big":
        desc.payload = b"\0" * (257 + i % 100)
    elif defect == "score_neg":
        desc.scores = {"robot_0": -1.0 - i}
    elif defect == "score_nan":
        desc.scores = {"robot_0": [math.nan, math.inf][i % 2]}
    elif defect == "score_key":
        desc.scores = {["", 3, None][i % 3]: 0.5}
    elif defect == "residual":
        desc.residual_std = [-1.0, math.inf, -math.inf][i % 3]
    elif defect == "forged":
        sign_kw = sign_desc(desc, signer=Signer.generate())
    elif defect == "unsigned":
        sign_kw = dict(round_idx=5, nonce=signed_messages.new_nonce(), signature=b"")
    elif defect == "replay":
        sign_kw = used
    elif defect == "late":
        sign_kw = sign_desc(desc, round_idx=i % 5)
    elif defect == "unknown":
        desc.robot_id = f"intruder_{i}"
    elif defect == "chaos":
        if field == "payload" and isinstance(chaos, bytes):
            chaos = 3  # bytes payloads are valid, no defect
        if (
            field == "residual_std"
            and isinstance(chaos, (int, float))
            and not isinstance(chaos, bool)
            and (math.isnan(chaos) or chaos >= 0)
        ):
            chaos = -1.0  # a gaussian descriptor may carry any residual >= 0 or NaN
        if field == "kind" and chaos in DESCRIPTOR_KINDS:
            chaos = "bogus"
        if (
            field == "num_samples"
            and isinstance(chaos, int)
            and not isinstance(chaos, bool)
            and 1 <= chaos <= 10_000
        ):
            chaos = 0
        if field == "scores" and chaos in (None, [], b"", "", 0, False):
            chaos = {"x": -1}
        if field in ("payload",) and chaos in (None, b"", "", 0, False, []):
            chaos = 3
        setattr(desc, field, chaos)
    elif defect == "ndim":
        desc.mean = desc.mean.reshape(2, 3)
    elif defect == "dtype":
        desc.mean = np.array(["a"] * 6)
    if not sign_kw:
        try:
            sign_kw = sign_desc(desc)
        except Exception:  # content that cannot even be digested: send any signature
            sign_kw = dict(round_idx=5, nonce=signed_messages.new_nonce(), signature=b"\1" * 64)
    d = validate_descriptor(desc, c, dims=dims, **sign_kw)
    assert isinstance(d, Decision) and not d.accepted, (defect, field, chaos, d)
    assert ctx.replay_guard.state() == guard_before


# ------------------------------------------------------------------ robot: cluster models

SERVER = Signer.generate()


@FUZZ
@given(
    cases=batch(
        st.sampled_from(
            (
                "rollback",
                "oversize",
                "forged",
                "unsigned",
                "digest",
                "nan",
                "schema",
                "dtype",
                "cluster_chaos",
                "round_chaos",
                "wrong_cluster",
                "huge",
            )
        ),
        st.integers(0, 10_000),
        ANY,
    )
)
def test_f1_cluster_model_handler(cases):
    for case in cases:
        _one_cluster_model(*case)


def _one_cluster_model(defect, i, chaos):
    params = good_params()
    before = {k: v.copy() for k, v in params.items()}
    digest = signed_messages.sha256_hex(payload(params))
    kw = dict(
        cluster_id=1,
        round_idx=9,
        params=params,
        expected_manifest=MANIFEST,
        total_bytes=96,
        payload_sha256=digest,
        received_sha256=digest,
        signature=SERVER.sign_cluster_model(9, 1, digest),
        server_public_key=SERVER.public_key,
        last_round=9,
        limits=Limits(max_cluster_model_bytes=1000),
    )
    if defect == "rollback":
        kw["round_idx"] = i % 9
    elif defect == "oversize":
        kw["total_bytes"] = 1001 + i
    elif defect == "forged":
        kw["signature"] = Signer.generate().sign_cluster_model(9, 1, digest)
    elif defect == "unsigned":
        kw["signature"] = b""
    elif defect == "digest":
        kw["received_sha256"] = hashlib.sha256(str(i).encode()).hexdigest()
    elif defect in ("nan", "huge"):
        kw["params"] = {k: v.copy() for k, v in params.items()}
        kw["params"]["b.weight"].reshape(-1)[i % 8] = np.nan if defect == "nan" else 1e12
    elif defect == "schema":
        kw["params"] = {k: v for k, v in list(params.items())[: i % 3]}
    elif defect == "dtype":
        kw["params"] = {**params, "a.bias": params["a.bias"].astype(np.float64)}
    elif defect == "cluster_chaos":
        kw["cluster_id"] = chaos if chaos != 1 or isinstance(chaos, bool) else 2
    elif defect == "round_chaos":
        kw["round_idx"] = chaos if chaos != 9 or isinstance(chaos, bool) else 8
    elif defect == "wrong_cluster":
        kw["cluster_id"] = 2 + i
    d = validate_cluster_model(**kw)
    assert isinstance(d, Decision) and not d.accepted, (defect, chaos, d)
    assert all(np.array_equal(before[k], params[k]) for k in before)


# ------------------------------------------------------------------ transport: PayloadAssembler


def _payload_msg(draw_fields: dict):
    from fed_ros.msg import TensorPayload, TensorSpec as TensorSpecMsg
    from fed_ros.ros.wire.tensors import set_bytes_field

    msg = TensorPayload()
    msg.payload_id = draw_fields["pid"]
    msg.manifest = [
        TensorSpecMsg(name=n, shape=list(s), dtype=dt) for n, s, dt in draw_fields["manifest"]
    ]
    msg.encoding = draw_fields["encoding"]
    msg.total_bytes = draw_fields["total"]
    msg.chunk_index = draw_fields["index"]
    msg.chunk_count = draw_fields["count"]
    msg.chunk_offset = draw_fields["offset"]
    set_bytes_field(msg, "data", draw_fields["data"])
    msg.sha256 = draw_fields["sha"]
    msg.bulk_uri = draw_fields["bulk"]
    return msg


SPEC = st.tuples(
    st.sampled_from(["a", "b", "a.weight", ""]),
    st.lists(st.integers(0, 6), max_size=3),
    st.sampled_from(["float32", "float64", ""]),
)
CHUNK = st.fixed_dictionaries(
    {
        "pid": st.sampled_from(["p0", "p1", "p2", "", "x" * 300]),
        "manifest": st.lists(SPEC, max_size=3),
        "encoding": st.integers(0, 255),
        "total": st.one_of(st.integers(0, 200), st.integers(0, 2**64 - 1)),
        "index": st.integers(0, 5),
        "count": st.integers(0, 5),
        "offset": st.one_of(st.integers(0, 200), st.integers(0, 2**64 - 1)),
        "data": st.binary(max_size=64),
        "sha": st.one_of(
            st.sampled_from(["", "0" * 64, hashlib.sha256(b"").hexdigest()]), st.text(max_size=70)
        ),
        "bulk": st.sampled_from(["", "tcp://127.0.0.1:1/x"]),
    }
)


@pytest.fixture(scope="module")
def transport():
    from fed_ros.ros.wire import chunk_assembler  # the assembling half of the chunked transfer

    return chunk_assembler


@FUZZ
@given(
    streams=st.lists(
        st.lists(CHUNK, min_size=1, max_size=4), min_size=BATCH // 3, max_size=BATCH // 3
    )
)
def test_f1_payload_assembler(transport, streams):
    """~10 hostile chunks per example (3 streams of 1-4 chunks) into fresh assemblers."""
    for chunks in streams:
        _one_stream(transport, chunks)


def _one_stream(transport, chunks):
    limits = transport.TransferLimits(max_total_bytes=4096, max_chunk_bytes=1024, max_chunks=8)
    asm = transport.PayloadAssembler(limits, max_pending=2)
    for fields in chunks:
        msg = _payload_msg(fields)
        before = (asm.pending_ids, asm.pending_bytes)
        try:
            out = asm.add(msg)
        except transport.PayloadRejected:
            # A rejected chunk adds nothing (a failed completion may only drop its own payload).
            assert set(asm.pending_ids) <= set(before[0]) and asm.pending_bytes <= before[1]
            continue
        if out is not None:  # only ever a complete payload whose bytes match the signed digest
            assert hashlib.sha256(out.data.tobytes()).hexdigest() == out.sha256 == msg.sha256
        assert asm.pending_bytes <= 2 * limits.max_total_bytes


# ------------------------------------------------------------------ conversion: descriptor messages


@FUZZ
@given(
    cases=batch(
        st.integers(0, 255),
        st.one_of(st.integers(0, 8), st.integers(0, 2**32 - 1)),
        st.lists(F32, max_size=6),
        st.lists(F32, max_size=6),
        st.lists(st.sampled_from(["", "robot_0", "a"]), max_size=3),
        st.lists(F32, max_size=3),
        F32,
        st.sampled_from([0, 1, 500, 10_001, 2**64 - 1]),
        st.binary(max_size=16),
        st.sampled_from(["robot_1", "", "zz"]),
    )
)
def test_f1_descriptor_message_conversion(descriptor_world, cases):
    """Whatever a ClientDescriptor message holds, conversion + validation never crash or change
    state."""
    for case in cases:
        _one_descriptor_msg(descriptor_world, *case)


def _one_descriptor_msg(
    descriptor_world, kind, dims, mean, var, ids, scores, resid, n, payload_, rid
):
    from fed_ros.msg import ClientDescriptor as Msg
    from fed_ros.ros.wire.round_msgs import descriptor_from_msg
    from fed_ros.ros.wire.tensors import set_bytes_field, set_float32_field

    ctx, used = descriptor_world
    guard_before = ctx.replay_guard.state()
    msg = Msg(
        robot_id=rid,
        round=5,
        kind=kind,
        dims=dims,
        score_robot_ids=ids,
        residual_std=resid,
        num_samples=n,
    )
    set_float32_field(msg, "mean", np.asarray(mean, np.float32))
    set_float32_field(msg, "variance", np.asarray(var, np.float32))
    set_float32_field(msg, "scores", np.asarray(scores, np.float32))
    set_bytes_field(msg, "payload", payload_)
    set_bytes_field(
        msg, "nonce", used["nonce"]
    )  # a spent nonce: even a well-formed one is a replay
    set_bytes_field(msg, "signature", b"\0" * 64)
    try:
        desc = descriptor_from_msg(msg)
    except ValueError:
        return  # rejected at conversion, with a reason
    d = validate_descriptor(
        desc,
        ctx,
        round_idx=int(msg.round),
        nonce=bytes(msg.nonce),
        signature=bytes(msg.signature),
        dims=int(msg.dims),
    )
    assert not d.accepted
    assert ctx.replay_guard.state() == guard_before


# ------------------------------------------------------------------ server round logic


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory):
    from fed_ros.core.rounds.store import ModelStore
    from fed_ros.core.strategies.base import make_strategy
    from fed_ros.core.rounds.coordinator import RoundCoordinator
    from fed_ros.core.rounds.settings import RoundSettings

    store_dir = tmp_path_factory.mktemp("store")
    coord = RoundCoordinator(
        make_strategy("fedavg"),
        ModelStore(store_dir),
        RoundSettings(algorithm="fedavg", rounds=3, round_timeout_s=1e9),
        good_params(),
        clock=lambda: 100.0,
    )
    for rid in SIGNERS:
        coord.roster.register(rid, num_samples=10)
    coord.start_round(now=100.0)
    return coord, store_dir


def _snapshot(coord, store_dir: Path):
    files = {p: p.read_bytes() for p in sorted(store_dir.rglob("*")) if p.is_file()}
    models = {c: {k: v.tobytes() for k, v in m.items()} for c, m in coord.cluster_models.items()}
    return files, models


@FUZZ
@given(
    cases=batch(
        st.sampled_from(
            ("round", "base", "robot", "nan", "shape", "dtype", "missing", "extra", "samples")
        ),
        st.integers(0, 1000),
    )
)
def test_f1_server_offer_update(coordinator, cases):
    coord, store_dir = coordinator
    before = _snapshot(coord, store_dir)
    for case in cases:
        _one_offer(coordinator, *case)
    assert _snapshot(coord, store_dir) == before  # no model and no checkpoint byte changed


def _one_offer(coordinator, defect, i):
    from fed_ros.core.strategies.types import ClientUpdate

    coord, store_dir = coordinator
    answers = dict(coord.collector.answers)
    params = good_params()
    rid, rnd, base, n = "robot_0", 0, 0, 10
    if defect == "round":
        rnd = 1 + i
    elif defect == "base":
        base = 1 + i
    elif defect == "robot":
        rid = f"x{i}"
    elif defect == "nan":
        params["a.weight"].reshape(-1)[i % 12] = np.nan
    elif defect == "shape":
        params["a.bias"] = np.zeros(5 + i % 3, np.float32)
    elif defect == "dtype":
        params["a.bias"] = params["a.bias"].astype(np.float64)
    elif defect == "missing":
        del params["b.weight"]
    elif defect == "extra":
        params[f"extra{i}"] = np.zeros(1, np.float32)
    elif defect == "samples":
        n = 0
    if defect in ("nan", "shape", "dtype", "missing", "extra"):
        # Tensor content is checked once, by the transfer receiver, before the coordinator sees it.
        from fed_ros.core.params import manifest_of
        from fed_ros.core.checks.payload_checks import check_tensors

        decision = check_tensors(params, manifest_of(good_params()), 1e6)
        assert not decision.accepted and decision.reason, defect
        return
    update = ClientUpdate(robot_id=rid, params=params, num_samples=n, base_round=base)
    update.round_idx = rnd
    verdict = coord.offer_update(update, now=100.0)
    assert not verdict.accepted and verdict.reason and verdict.code, defect
    assert coord.collector.answers == answers
