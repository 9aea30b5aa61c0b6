"""The fleet encoder on the wire: a whole float32 encoder in one TensorPayload, both ways.

The encoder is a few hundred kB, so it travels unchunked (FleetEncoder server -> robots,
EncoderUpdate robot -> server). Decoding trusts nothing the sender says about the layout: the
receiver's own manifest decides names, shapes and size, and every mismatch is a ValueError
naming it, before a byte is interpreted.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from fed_ros.core.checks.payload_checks import compare_manifest
from fed_ros.core.params import Manifest, StateDict
from fed_ros.msg import TensorPayload
from fed_ros.ros.wire.tensors import (
    bytes_view,
    decode_state_dict,
    encode_state_dict,
    encoded_size,
    payload_chunk,
    sha256_hex,
)


def encoder_payload(state: Mapping[str, np.ndarray], payload_id: str) -> TensorPayload:
    """``state`` as one float32 TensorPayload (chunk 0 of 1)."""
    encoded = encode_state_dict(state, "float32")
    return payload_chunk(encoded, payload_id, 0, max(1, encoded.total_bytes))


def decode_encoder_payload(payload: TensorPayload, manifest: Manifest) -> StateDict:
    """The encoder in ``payload``, laid out by ``manifest``; ValueError saying what is wrong."""
    if payload.encoding != TensorPayload.ENCODING_FLOAT32:
        raise ValueError(f"encoding {payload.encoding} (an encoder travels as float32)")
    if payload.chunk_count != 1 or payload.chunk_index != 0 or payload.bulk_uri:
        raise ValueError(
            f"chunk {payload.chunk_index} of {payload.chunk_count} (an encoder travels whole)"
        )
    why = compare_manifest(payload.manifest, manifest)
    if why is not None:
        raise ValueError(why)
    expected = encoded_size(manifest, TensorPayload.ENCODING_FLOAT32)
    data = bytes_view(payload.data)
    if payload.total_bytes != expected or data.nbytes != expected:
        raise ValueError(
            f"{data.nbytes} bytes (total_bytes {payload.total_bytes}), expected {expected}"
        )
    if sha256_hex(data) != payload.sha256:
        raise ValueError("sha256 does not match the bytes")
    return decode_state_dict(manifest, TensorPayload.ENCODING_FLOAT32, data, copy=True)
