"""The fleet encoder's payload on the wire (fed_ros.ros.wire.encoder_msgs): whole, float32, and
decoded only by the receiver's own manifest; every mismatch is refused naming it."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("rclpy")

from fed_ros.core.params import manifest_of  # noqa: E402
from fed_ros.ros.wire.encoder_msgs import decode_encoder_payload, encoder_payload  # noqa: E402

STATE = {
    "backbone.conv1.weight": np.arange(24, dtype=np.float32).reshape(2, 3, 2, 2),
    "head.bias": np.full(3, -1.5, np.float32),
}
MANIFEST = manifest_of(STATE)


def test_an_encoder_round_trips_whole_and_exact():
    payload = encoder_payload(STATE, "encoder-3")
    assert (payload.chunk_index, payload.chunk_count, payload.total_bytes) == (0, 1, 27 * 4)
    out = decode_encoder_payload(payload, MANIFEST)
    assert list(out) == list(STATE)
    for k, v in STATE.items():
        np.testing.assert_array_equal(out[k], v)


def _edited(field: str):
    payload = encoder_payload(STATE, "encoder-3")
    if field == "encoding":
        payload.encoding = 1
    elif field == "chunked":
        payload.chunk_count = 2
    elif field == "bytes":
        payload.data = payload.data[:-4]
    elif field == "sha":
        payload.sha256 = "0" * 64
    return payload


@pytest.mark.parametrize(
    "field, message",
    [
        ("encoding", "encoding 1 (an encoder travels as float32)"),
        ("chunked", "chunk 0 of 2 (an encoder travels whole)"),
        ("bytes", "104 bytes (total_bytes 108), expected 108"),
        ("sha", "sha256 does not match the bytes"),
    ],
)
def test_a_malformed_encoder_payload_is_refused_naming_what(field, message):
    with pytest.raises(ValueError) as err:
        decode_encoder_payload(_edited(field), MANIFEST)
    assert message in str(err.value)


def test_an_encoder_of_another_layout_is_refused_by_the_receivers_manifest():
    other = dict(STATE, **{"head.bias": np.zeros(4, np.float32)})
    with pytest.raises(ValueError, match=r"tensor 'head.bias' has shape \(4,\), expected \(3,\)"):
        decode_encoder_payload(encoder_payload(other, "x"), MANIFEST)
