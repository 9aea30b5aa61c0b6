"""Quantized, deflated update deltas (fed_ros.core.encodings.quantized_delta), ROS-free:
accuracy against quantizing the weights, bytes against the blockwise encodings, error feedback,
and hostile payloads (deflate bombs included)."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from fed_ros.core.checks.decisions import SIZE_MISMATCH
from fed_ros.core.checks.payload_checks import check_payload_manifest
from fed_ros.core.encodings import DELTA_ENCODINGS, encoded_nbytes, is_delta, roundtrip
from fed_ros.core.encodings import quantized_delta as qd
from fed_ros.core.encodings.blockwise import encode_block_tensor
from fed_ros.core.encodings.feedback import ErrorFeedback
from fed_ros.core.params import TensorSpec


def _trained_pair(seed: int = 0, n: int = 4096) -> tuple[dict, dict]:
    """A start model with weights of order 0.1-1 and a trained model a small step away (the
    shape of a local round's change: most entries move little, a few more)."""
    rng = np.random.default_rng(seed)
    start = {
        "w": rng.normal(0, 0.5, (n // 64, 64)).astype(np.float32),
        "b": rng.normal(0, 0.1, 64).astype(np.float32),
    }
    step = {k: (rng.standard_t(3, v.shape) * 1e-3).astype(np.float32) for k, v in start.items()}
    return start, {k: start[k] + step[k] for k in start}


def _err(decoded: dict, truth: dict) -> float:
    return float(np.sqrt(sum(np.sum((decoded[k] - truth[k]) ** 2) for k in truth)))


@pytest.mark.parametrize(
    "encoding,weights", [("int8_delta", "int8_block"), ("int4_delta", "int4_block")]
)
def test_a_delta_is_decoded_far_closer_than_the_quantized_weights_in_fewer_bytes(encoding, weights):
    start, trained = _trained_pair()
    delta = {k: trained[k] - start[k] for k in start}
    via_delta = {k: start[k] + v for k, v in roundtrip(delta, encoding).items()}
    via_weights = roundtrip(trained, weights)
    # The same bits on a range hundreds of times narrower.
    assert _err(via_delta, trained) < 0.05 * _err(via_weights, trained)
    # Deflate shrinks the delta's levels below the blockwise payload of the same values.
    assert qd.payload_nbytes(delta, encoding) < encoded_nbytes(delta, weights)
    assert qd.payload_nbytes(delta, encoding) < qd.raw_nbytes(
        [v.size for v in delta.values()], encoding
    )


def test_error_feedback_carries_the_rounding_error_into_later_rounds(tmp_path):
    """Sending the same change every round under int4_delta: without feedback the rounding error
    adds up round after round; with it the total delivered stays within one round's error."""
    start, trained = _trained_pair(seed=1)
    feedback = ErrorFeedback(tmp_path / "residual.npz")
    delivered = {k: np.zeros_like(v) for k, v in start.items()}
    naive = {k: np.zeros_like(v) for k, v in start.items()}
    rounds = 20
    for _ in range(rounds):
        full = feedback.delta_to_send(trained, start)
        sent = roundtrip(full, "int4_delta")
        feedback.keep_unsent(full, sent)
        once = roundtrip({k: trained[k] - start[k] for k in start}, "int4_delta")
        for k in start:
            delivered[k] += sent[k]
            naive[k] += once[k]
    truth = {k: rounds * (trained[k] - start[k]) for k in start}
    one_round_error = _err(
        roundtrip({k: trained[k] - start[k] for k in start}, "int4_delta"),
        {k: trained[k] - start[k] for k in start},
    )
    assert _err(delivered, truth) <= 2 * one_round_error
    assert _err(naive, truth) > 5 * _err(delivered, truth)
    assert (tmp_path / "residual.npz").exists()  # kept across restarts


def _raw(tensors: dict, encoding: str = "int8_delta") -> bytes:
    quant = qd.DELTA_QUANTIZERS[encoding]
    return b"".join(encode_block_tensor(v, quant, k) for k, v in tensors.items())


def _bad(kind: str) -> bytes:
    values = {"w": np.linspace(-1, 1, 300, dtype=np.float32)}
    raw = _raw(values)
    if kind == "not_zlib":
        return b"\x00\x01garbage" * 4
    if kind == "truncated":
        return zlib.compress(raw)[:-6]
    if kind == "trailing":
        return zlib.compress(raw) + b"\x00\x00"
    if kind == "short":
        return zlib.compress(raw[:-10])
    if kind == "bomb":  # 64 MiB of zeros in about 64 KB: refused after inflating one byte past
        return zlib.compress(b"\x00" * (64 << 20), 9)
    if kind == "nan_scale":
        bad = bytearray(raw)
        bad[0:4] = np.float32(np.nan).tobytes()
        return zlib.compress(bytes(bad))
    raise AssertionError(kind)


@pytest.mark.parametrize(
    "kind,match",
    [
        ("not_zlib", "is not a zlib stream"),
        ("truncated", "truncated"),
        ("trailing", "2 bytes after its zlib stream"),
        ("short", "inflates to 302 bytes; the manifest implies 312"),
        ("bomb", "inflates past the 312 bytes"),
        ("nan_scale", "tensor 'w': int8_block: a block scale is not finite"),
    ],
)
def test_hostile_payloads_are_refused_naming_what_is_wrong(kind, match):
    with pytest.raises(ValueError, match=match):
        qd.decode_payload(np.frombuffer(_bad(kind), np.uint8), [300], ["w"], "int8_delta")


def test_encoding_refuses_non_finite_deltas_and_unknown_names():
    with pytest.raises(ValueError, match="tensor 'w' is not finite"):
        qd.encode_payload({"w": np.array([1.0, np.inf], np.float32)}, "int8_delta")
    with pytest.raises(ValueError, match="unknown delta encoding 'int2_delta'"):
        qd.encode_payload({"w": np.zeros(3, np.float32)}, "int2_delta")
    assert is_delta("int4_delta") and is_delta("topk:0.05")
    assert not is_delta("int4_block")


@pytest.mark.parametrize(
    "wire,name", [(qd.Int8Delta.wire_id, "int8_delta"), (qd.Int4Delta.wire_id, "int4_delta")]
)
def test_the_server_size_check_takes_any_size_deflate_can_produce(wire, name):
    manifest = (TensorSpec("w", (64, 64)), TensorSpec("b", (64,)))
    sizes = [4096, 64]
    lo, hi = qd.payload_bounds(sizes, name)
    assert (lo, hi) == (1, qd.deflate_bound(qd.raw_nbytes(sizes, name)))
    # Incompressible values (uniform noise) come out longer than the raw levels, within the bound.
    noise = np.random.default_rng(0).uniform(-1, 1, 4160).astype(np.float32)
    payload = qd.encode_payload({"w": noise[:4096], "b": noise[4096:]}, name)
    assert len(payload) > qd.raw_nbytes(sizes, name) - 64
    assert check_payload_manifest(manifest, len(payload), wire, manifest)
    d = check_payload_manifest(manifest, hi + 1, wire, manifest)
    assert not d and d.code == SIZE_MISMATCH


@pytest.mark.parametrize("encoding", [e for e in DELTA_ENCODINGS if e != "topk"])
def test_the_wire_format_carries_delta_encodings_and_refuses_a_tampered_stream(encoding):
    pytest.importorskip("rclpy")
    from fed_ros.core.params import manifest_of
    from fed_ros.ros.wire.tensors import decode_state_dict, encode_state_dict, size_range

    start, trained = _trained_pair(seed=2)
    delta = {k: trained[k] - start[k] for k in start}
    enc = encode_state_dict(delta, encoding)
    lo, hi = size_range(manifest_of(delta), enc.encoding)
    assert enc.total_bytes == qd.payload_nbytes(delta, encoding) and lo <= enc.total_bytes <= hi
    assert enc.scales.size == 0  # block scales travel inside the deflated, hashed payload
    out = decode_state_dict(enc.manifest, encoding, enc.data)
    expected = roundtrip(delta, encoding)
    for name in delta:
        assert np.array_equal(out[name], expected[name]), name
    with pytest.raises(ValueError, match="truncated|not a zlib stream"):
        decode_state_dict(enc.manifest, encoding, enc.data[:-1])
