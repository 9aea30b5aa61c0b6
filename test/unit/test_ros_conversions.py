"""Pure message conversions (no ROS processes): state dicts <-> TensorPayload chunks,
manifests, descriptors, round announcements."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rclpy.serialization import deserialize_message, serialize_message

from fed_ros.core.params import TensorSpec
from fed_ros.core.rounds.config import RoundConfig
from fed_ros.core.strategies.types import ClientDescriptor
from fed_ros.msg import ClientDescriptor as ClientDescriptorMsg
from fed_ros.msg import ClusterModel, ModelUpdate, RoundAnnouncement, TensorPayload
from fed_ros.msg import TensorSpec as TensorSpecMsg
from fed_ros.ros.wire.round_msgs import (
    Announcement,
    announcement_from_msg,
    announcement_to_msg,
    cluster_model_msg,
    descriptor_from_msg,
    descriptor_to_msg,
    model_update_msg,
)
from fed_ros.ros.wire.tensors import (
    bytes_view,
    chunk_ranges,
    decode_state_dict,
    encode_state_dict,
    manifest_from_msgs,
    manifest_to_msgs,
    payload_chunk,
    set_bytes_field,
    set_float32_field,
    sha256_hex,
)


def _state_dict(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "enc.conv.weight": rng.standard_normal((8, 3, 3, 3), dtype=np.float32),
        "enc.conv.bias": rng.standard_normal(8, dtype=np.float32),
        "head.scale": np.asarray(rng.standard_normal(), dtype=np.float32).reshape(()),
        "head.weight": rng.standard_normal((4, 16), dtype=np.float32),
    }


def test_float32_round_trip_is_exact_and_zero_copy() -> None:
    sd = _state_dict()
    enc = encode_state_dict(sd, "float32")
    assert enc.total_bytes == sum(v.nbytes for v in sd.values())
    out = decode_state_dict(enc.manifest, enc.encoding, enc.data)
    assert list(out) == list(sd)
    for name in sd:
        assert out[name].shape == sd[name].shape and out[name].dtype == np.float32
        np.testing.assert_array_equal(out[name], sd[name])
        assert np.shares_memory(out[name], enc.data)  # views, not copies
    copied = decode_state_dict(enc.manifest, enc.encoding, enc.data, copy=True)
    assert not np.shares_memory(copied["head.weight"], enc.data)


@pytest.mark.parametrize(
    "encoding,tol_factor,itemsize", [("float16", 1e-3, 2), ("int8", 1 / 127 * 0.51, 1)]
)
def test_lossy_encodings_within_bound(encoding: str, tol_factor: float, itemsize: int) -> None:
    sd = _state_dict(1)
    enc = encode_state_dict(sd, encoding)
    assert enc.total_bytes == sum(v.size for v in sd.values()) * itemsize
    assert enc.scales.size == (len(sd) if encoding == "int8" else 0)
    out = decode_state_dict(enc.manifest, enc.encoding, enc.data, enc.scales)
    for name, value in sd.items():
        peak = float(np.max(np.abs(value)))
        assert out[name].dtype == np.float32
        assert np.max(np.abs(out[name] - value)) <= tol_factor * max(peak, 1.0) + 1e-7, name


def test_int8_of_all_zero_tensor_decodes_to_zeros() -> None:
    sd = {"z": np.zeros((3, 3), np.float32)}
    enc = encode_state_dict(sd, "int8")
    out = decode_state_dict(enc.manifest, enc.encoding, enc.data, enc.scales)
    np.testing.assert_array_equal(out["z"], 0.0)


def test_int8_rejects_non_finite() -> None:
    with pytest.raises(ValueError, match="'bad'"):
        encode_state_dict({"bad": np.array([1.0, np.nan], np.float32)}, "int8")


def test_float16_rejects_values_out_of_range() -> None:
    with pytest.raises(ValueError, match="'big'.*float16 range"):
        encode_state_dict({"big": np.array([1.0, 7e4], np.float32)}, "float16")


def test_encode_rejects_bad_dtype_and_unknown_encoding() -> None:
    with pytest.raises(ValueError, match="'w'"):
        encode_state_dict({"w": np.zeros(3, np.float64)})
    with pytest.raises(ValueError, match="bfloat16"):
        encode_state_dict(_state_dict(), "bfloat16")


def test_decode_rejects_size_mismatch_and_missing_scales() -> None:
    enc = encode_state_dict(_state_dict())
    with pytest.raises(ValueError, match="bytes"):
        decode_state_dict(enc.manifest, enc.encoding, enc.data[:-4])
    enc8 = encode_state_dict(_state_dict(), "int8")
    with pytest.raises(ValueError, match="scales"):
        decode_state_dict(enc8.manifest, enc8.encoding, enc8.data, enc8.scales[:-1])


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 5), st.integers(1, 4)), min_size=0, max_size=6),
    st.integers(1, 64),
)
def test_chunks_reassemble_any_layout(shapes: list[tuple[int, int]], chunk_bytes: int) -> None:
    rng = np.random.default_rng(len(shapes) * 1000 + chunk_bytes)
    sd = {f"t{i}": rng.standard_normal(s, dtype=np.float32) for i, s in enumerate(shapes)}
    enc = encode_state_dict(sd)
    ranges = chunk_ranges(enc.total_bytes, chunk_bytes)
    msgs = [payload_chunk(enc, "p", i, chunk_bytes) for i in range(len(ranges))]
    assert all(m.chunk_count == len(ranges) for m in msgs)
    joined = b"".join(bytes(m.data) for m in msgs)
    assert joined == enc.data.tobytes() and sha256_hex(joined) == enc.sha256
    out = decode_state_dict(manifest_from_msgs(msgs[0].manifest), msgs[0].encoding, joined)
    for name in sd:
        np.testing.assert_array_equal(out[name], sd[name])


def test_chunk_data_is_a_view_not_an_elementwise_copy() -> None:
    big = {"w": np.arange(1 << 20, dtype=np.float32)}  # 4 MiB
    enc = encode_state_dict(big)
    msg = payload_chunk(enc, "robot_1/r0/update", 1, 1 << 20)
    assert isinstance(msg._data, memoryview)
    assert np.shares_memory(np.asarray(msg._data), enc.data)
    assert (msg.chunk_index, msg.chunk_count, msg.chunk_offset, len(msg.data)) == (
        1,
        4,
        1 << 20,
        1 << 20,
    )


def test_serialized_chunk_round_trip_preserves_bytes() -> None:
    sd = _state_dict(2)
    enc = encode_state_dict(sd, "int8")
    chunk = payload_chunk(enc, "robot_2/r3/update", 0, 1 << 20)
    update = model_update_msg(
        chunk,
        robot_id="robot_2",
        round_idx=3,
        base_round=2,
        cluster_id=1,
        num_samples=1234,
        train_loss=0.5,
        nonce=b"\x01" * 16,
        signature=b"sig",
    )
    back = deserialize_message(serialize_message(update), ModelUpdate)
    assert (back.robot_id, back.round, back.base_round, back.cluster_id, back.num_samples) == (
        "robot_2",
        3,
        2,
        1,
        1234,
    )
    assert bytes(back.nonce) == b"\x01" * 16 and bytes(back.signature) == b"sig"
    assert bytes_view(back.payload.data).tobytes() == enc.data.tobytes()
    assert back.payload.sha256 == enc.sha256
    np.testing.assert_array_equal(np.asarray(back.payload.scales, np.float32), enc.scales)
    out = decode_state_dict(
        manifest_from_msgs(back.payload.manifest),
        back.payload.encoding,
        back.payload.data,
        back.payload.scales,
    )
    assert list(out) == list(sd)
    cm = cluster_model_msg(chunk, cluster_id=1, round_idx=3, member_robot_ids=["robot_2"])
    back_cm = deserialize_message(serialize_message(cm), ClusterModel)
    assert list(back_cm.member_robot_ids) == ["robot_2"] and back_cm.payload.sha256 == enc.sha256


def test_bulk_control_chunk_carries_no_data() -> None:
    enc = encode_state_dict(_state_dict())
    msg = payload_chunk(enc, "p", 0, 16, bulk_uri="tcp://127.0.0.1:5555/abc")
    assert (msg.chunk_count, len(msg.data), msg.total_bytes) == (1, 0, enc.total_bytes)


def test_payload_chunk_validates_arguments() -> None:
    enc = encode_state_dict(_state_dict())
    with pytest.raises(ValueError, match="payload_id"):
        payload_chunk(enc, "", 0, 16)
    with pytest.raises(ValueError, match="chunk index 99"):
        payload_chunk(enc, "p", 99, 1 << 20)
    with pytest.raises(ValueError, match="chunk_bytes"):
        chunk_ranges(10, 0)


def test_manifest_round_trip_and_validation() -> None:
    manifest = (TensorSpec("a", (2, 3)), TensorSpec("b", ()))
    msgs = manifest_to_msgs(manifest)
    assert manifest_from_msgs(msgs) == manifest
    with pytest.raises(ValueError, match="duplicate tensor name 'a'"):
        manifest_from_msgs([TensorSpecMsg(name="a", shape=[1], dtype="float32")] * 2)
    with pytest.raises(ValueError, match="int64"):
        manifest_from_msgs([TensorSpecMsg(name="a", shape=[1], dtype="int64")])
    with pytest.raises(ValueError, match="empty tensor name"):
        manifest_from_msgs([TensorSpecMsg(name="", shape=[1], dtype="float32")])


def test_set_bytes_field_rejects_unknown_field() -> None:
    with pytest.raises(ValueError, match="no field 'bogus'"):
        set_bytes_field(TensorPayload(), "bogus", b"")


def test_descriptor_round_trip() -> None:
    desc = ClientDescriptor(
        robot_id="robot_3",
        kind="gaussian",
        mean=np.arange(4, dtype=np.float32),
        variance=np.full(4, 0.5, np.float32),
        num_samples=77,
        scores={"robot_1": 0.25, "robot_2": 1.5},
        residual_std=0.1,
        payload=b"rnd",
    )
    msg = descriptor_to_msg(desc, round_idx=5, nonce=b"n" * 16)
    back_msg = deserialize_message(serialize_message(msg), ClientDescriptorMsg)
    assert (
        back_msg.dims == 4
        and back_msg.round == 5
        and back_msg.kind == ClientDescriptorMsg.KIND_GAUSSIAN
    )
    back = descriptor_from_msg(back_msg)
    assert back.robot_id == "robot_3" and back.num_samples == 77 and back.payload == b"rnd"
    np.testing.assert_array_equal(back.mean, desc.mean)
    np.testing.assert_array_equal(back.variance, desc.variance)
    assert back.scores == desc.scores and math.isclose(back.residual_std, 0.1, rel_tol=1e-6)


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda m: setattr(m, "dims", 5), "dims=5"),
        (
            lambda m: set_float32_field(m, "variance", np.array([1, 1, 0, 1], np.float32)),
            "variances",
        ),
        (
            lambda m: set_float32_field(m, "mean", np.array([1, np.nan, 0, 1], np.float32)),
            "non-finite",
        ),
        (lambda m: setattr(m, "kind", 9), "unknown kind 9"),
        (lambda m: setattr(m, "score_robot_ids", ["a"]), "score ids"),
    ],
)
def test_descriptor_from_msg_rejects_bad_input(mutate, match: str) -> None:
    desc = ClientDescriptor(
        robot_id="r",
        kind="gaussian",
        mean=np.ones(4, np.float32),
        variance=np.ones(4, np.float32),
        num_samples=1,
    )
    msg = descriptor_to_msg(desc, round_idx=0)
    mutate(msg)
    with pytest.raises(ValueError, match=match):
        descriptor_from_msg(msg)


def test_announcement_round_trip() -> None:
    cfg0 = RoundConfig(prox_mu=0.01, local_epochs=2, lr=3e-3, local_steps=20)
    cfg1 = RoundConfig(
        use_sub=True,
        use_act=True,
        lambda_sub=0.1,
        descriptor_kind="rnd",
        pick_cluster=True,
        eval_episodes=3,
    )
    ann = Announcement(
        round_idx=4,
        stage="train",
        deadline_s=1234.5,
        algorithm="feddrman",
        participants=("robot_0", "robot_1"),
        memberships={"robot_0": [(0, 1.0)], "robot_1": [(0, 0.25), (1, 0.75)]},
        quorum=2,
        configs={"robot_0": cfg0, "robot_1": cfg1},
    )
    msg = announcement_to_msg(ann)
    back = announcement_from_msg(deserialize_message(serialize_message(msg), RoundAnnouncement))
    assert back.round_idx == 4 and back.stage == "train" and back.algorithm == "feddrman"
    assert back.participants == ("robot_0", "robot_1") and back.quorum == 2
    assert math.isclose(back.deadline_s, 1234.5)
    assert back.memberships["robot_1"] == [(0, 0.25), (1, 0.75)]
    # Every field of each robot's round config survives the wire exactly (float64 fields).
    assert back.configs == {"robot_0": cfg0, "robot_1": cfg1}


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("version", 2, "version 2 is not supported"),
        ("prox_mu", -1.0, "prox_mu must be >= 0"),
        ("lambda_sub", float("nan"), "lambda_sub must be a finite number"),
        ("local_epochs", 0, "local_epochs must be an int >= 1"),
        ("descriptor_kind", "update", "descriptor_kind 'update'"),
    ],
)
def test_announcement_with_a_bad_round_config_is_rejected_naming_it(field, value, match) -> None:
    ann = Announcement(
        round_idx=0,
        stage="train",
        deadline_s=1.0,
        algorithm="fedavg",
        participants=("a",),
        memberships={"a": [(0, 1.0)]},
        quorum=1,
    )
    msg = announcement_to_msg(ann)
    setattr(msg.memberships[0].config, field, value)
    with pytest.raises(ValueError, match=f"round config of 'a'.*{match}"):
        announcement_from_msg(deserialize_message(serialize_message(msg), RoundAnnouncement))


def test_announcement_validation() -> None:
    base = dict(
        round_idx=0,
        stage="train",
        deadline_s=1.0,
        algorithm="fedavg",
        participants=("a",),
        memberships={"a": [(0, 1.0)]},
        quorum=1,
    )
    with pytest.raises(ValueError, match="stage 'sleep'"):
        announcement_to_msg(Announcement(**{**base, "stage": "sleep"}))
    with pytest.raises(ValueError, match="quorum 2"):
        announcement_to_msg(Announcement(**{**base, "quorum": 2}))
    with pytest.raises(ValueError, match="sum to 0.5"):
        announcement_to_msg(Announcement(**{**base, "memberships": {"a": [(0, 0.5)]}}))
    msg = announcement_to_msg(Announcement(**base))
    msg.memberships[0].weights = [0.5, 0.5]
    with pytest.raises(ValueError, match="1 clusters, 2 weights"):
        announcement_from_msg(msg)
