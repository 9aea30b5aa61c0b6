"""Value encodings on the wire (fed_ros.core.encodings, issue 26 item 1): error bounds, sizes,
refusals; and the same encodings through the wire format (fed_ros.ros.wire.tensors)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fed_ros.core.encodings import MODEL_ENCODINGS, encoded_nbytes, model_encoding, roundtrip
from fed_ros.core.encodings.blockwise import (
    BLOCK,
    block_count,
    block_nbytes,
    dequantize_blocks,
    quantize_blocks,
)


def _model(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    w = rng.normal(0, 0.02, (300, 70)).astype(np.float32)
    w[0, 0] = 5.0  # one large weight: a per-tensor int8 scale flattens the small ones
    return {
        "w": w,
        "b": rng.normal(0, 1, (129,)).astype(np.float32),
        "e": np.zeros((0, 3), np.float32),
    }


def test_block_layout_sizes():
    assert BLOCK == 128 and [block_count(n) for n in (0, 1, 128, 129, 256)] == [0, 1, 1, 2, 2]
    assert [block_nbytes(n) for n in (0, 1, 128, 129)] == [0, 5, 132, 137]
    sd = _model()
    n = 300 * 70 + 129
    assert encoded_nbytes(sd, "float32") == 4 * n
    assert encoded_nbytes(sd, "float16") == 2 * n
    assert encoded_nbytes(sd, "int8") == n + 4 * 3
    assert encoded_nbytes(sd, "int8_block") == block_nbytes(21000) + block_nbytes(129)
    assert 4 * n / encoded_nbytes(sd, "int8_block") > 3.8  # the >= 4x target minus block scales


def test_blockwise_error_is_half_a_step_of_its_own_block_and_beats_per_tensor_int8():
    sd = _model()
    w = sd["w"].reshape(-1)
    scales, q = quantize_blocks(w)
    dec = dequantize_blocks(scales, q)
    steps = np.repeat(scales, BLOCK)[: w.size]
    assert np.all(np.abs(dec - w) <= steps / 2 + 1e-7)
    assert q.dtype == np.int8 and np.abs(q).max() == 127
    block_err = np.abs(roundtrip(sd, "int8_block")["w"] - sd["w"]).mean()
    tensor_err = np.abs(roundtrip(sd, "int8")["w"] - sd["w"]).mean()
    assert block_err < tensor_err / 10, (block_err, tensor_err)
    assert np.array_equal(roundtrip(sd, "float32")["w"], sd["w"])
    f16 = roundtrip(sd, "float16")["b"]
    assert np.allclose(f16, sd["b"], rtol=1e-3) and f16.dtype == np.float32
    assert roundtrip(sd, "int8_block")["e"].shape == (0, 3)
    zeros = roundtrip({"z": np.zeros(5, np.float32)}, "int8_block")["z"]
    assert np.array_equal(zeros, np.zeros(5, np.float32))


def test_bad_values_scales_and_names_are_refused_naming_them():
    with pytest.raises(ValueError, match="tensor 'w' is not finite"):
        quantize_blocks(np.array([1.0, math.nan], np.float32), "w")
    with pytest.raises(ValueError, match="tensor 'x' exceeds the float16 range"):
        roundtrip({"x": np.array([1e6], np.float32)}, "float16")
    with pytest.raises(ValueError, match="tensor 'y' is not finite; int8"):
        roundtrip({"y": np.array([math.inf], np.float32)}, "int8")
    with pytest.raises(ValueError, match="130 values need 2 block scales, got 1"):
        dequantize_blocks(np.ones(1, np.float32), np.zeros(130, np.int8))
    with pytest.raises(ValueError, match="a block scale is not finite"):
        dequantize_blocks(np.array([math.inf], np.float32), np.zeros(3, np.int8))
    with pytest.raises(ValueError, match=r"unknown model encoding 'int4'; expected one of"):
        model_encoding("int4")
    with pytest.raises(ValueError, match=r"'int8_delta'.*a delta encoding is for updates only"):
        model_encoding("int8_delta")
    assert MODEL_ENCODINGS == ("float32", "float16", "int8", "int8_block", "int4_block")


@pytest.mark.parametrize("encoding,bad_scale", [("int8_block", math.inf), ("int4_block", math.nan)])
def test_the_wire_format_carries_blockwise_encodings_and_refuses_a_bad_scale(encoding, bad_scale):
    pytest.importorskip("rclpy")
    from fed_ros.core.params import manifest_of
    from fed_ros.ros.wire.tensors import decode_state_dict, encode_state_dict, encoded_size

    sd = _model()
    enc = encode_state_dict(sd, encoding)
    assert (
        enc.total_bytes
        == encoded_nbytes(sd, encoding)
        == encoded_size(manifest_of(sd), enc.encoding)
    )
    assert enc.scales.size == 0  # the block scales travel inside the payload (signed, hashed)
    out = decode_state_dict(enc.manifest, encoding, enc.data)
    for name in sd:
        assert np.array_equal(out[name], roundtrip(sd, encoding)[name]), name
    bad = enc.data.copy()
    bad[0:4] = np.frombuffer(np.float32(bad_scale).tobytes(), np.uint8)  # tensor w's 1st scale
    with pytest.raises(ValueError, match=f"tensor 'w': {encoding}: a block scale is not finite"):
        decode_state_dict(enc.manifest, encoding, bad)
    with pytest.raises(ValueError, match="payload has"):
        decode_state_dict(enc.manifest, encoding, enc.data[:-1])


def test_int4_block_packs_two_values_a_byte_within_half_a_step_of_its_block():
    from fed_ros.core.encodings.blockwise import BLOCK4, decode_block_tensor, encode_block_tensor

    assert BLOCK4 == 64 and "int4_block" in MODEL_ENCODINGS
    assert [block_nbytes(n, "int4_block") for n in (0, 1, 2, 64, 65)] == [0, 5, 5, 36, 41]
    sd = _model()
    assert encoded_nbytes(sd, "float32") / encoded_nbytes(sd, "int4_block") > 7.0
    out = roundtrip(sd, "int4_block")
    for name, value in sd.items():
        flat, dec = value.reshape(-1), out[name].reshape(-1)
        for start in range(0, flat.size, BLOCK4):  # each value within half its block's step
            block = flat[start : start + BLOCK4]
            step = np.abs(block).max() / 7.0
            assert np.all(np.abs(dec[start : start + BLOCK4] - block) <= step / 2 + 1e-7), name
    # Odd lengths: the padding nibble never becomes a value; every level -7..7 survives.
    levels = np.arange(-7, 8, dtype=np.float32)
    raw = np.frombuffer(encode_block_tensor(levels, "int4_block"), np.uint8)
    assert raw.size == 4 + 8 and np.array_equal(decode_block_tensor(raw, 15, "int4_block"), levels)
