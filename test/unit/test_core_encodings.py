"""The encoding registry (fed_ros.core.encodings, issue 38 item 3): every registered encoding keeps
the same contract, so a new one is tested by being registered.

Per entry: its payload falls inside the sizes its own ``size_range`` allows (what a receiver
checks before buffering), its scales are as many as ``scale_count`` says, decoding gives what
``roundtrip`` charges in the benchmarks, a payload one byte short or long is refused, and the
admission check and the wire format agree with it.
"""

from __future__ import annotations

import numpy as np
import pytest

from fed_ros.core import encodings
from fed_ros.core.checks.decisions import SIZE_MISMATCH
from fed_ros.core.checks.payload_checks import check_payload_manifest
from fed_ros.core.params import manifest_of


def _delta(seed: int = 0) -> dict[str, np.ndarray]:
    """A small update delta: one tensor over top-k's whole-tensor size, one under it, a matrix."""
    rng = np.random.default_rng(seed)
    return {
        "w": rng.normal(0, 1e-3, 1000).astype(np.float32),
        "b": rng.normal(0, 1e-3, 7).astype(np.float32),
        "m": rng.normal(0, 1e-3, (16, 24)).astype(np.float32),
    }


@pytest.mark.parametrize("enc", encodings.REGISTRY, ids=lambda e: e.name)
def test_every_registered_encoding_keeps_the_contract(enc):
    sd = _delta()
    sizes = [v.size for v in sd.values()]
    payload, scales = enc.encode(sd)
    lo, hi = enc.size_range(sizes)
    assert payload.dtype == np.uint8 and payload.flags.c_contiguous
    assert lo <= payload.nbytes <= hi
    assert scales.dtype == np.float32 and scales.size == enc.scale_count(len(sd))
    assert enc.nbytes(sd) == payload.nbytes + 4 * scales.size
    flat = enc.decode(payload, sizes, list(sd), scales)
    expected = enc.roundtrip(sd)
    for (name, value), got in zip(sd.items(), flat):
        assert got.dtype == np.float32 and got.size == value.size, name
        assert np.array_equal(got.reshape(value.shape), expected[name]), name
        # Within the encoding's own error: a delta of 1e-3 is never off by more than itself.
        assert np.max(np.abs(got.reshape(value.shape) - value)) <= np.max(np.abs(value)), name
    manifest = manifest_of(sd)
    assert check_payload_manifest(manifest, payload.nbytes, enc.wire_id, manifest)
    if lo == hi:  # a fixed size: one byte off either way is refused before decoding
        for wrong in (lo - 1, lo + 1):
            d = check_payload_manifest(manifest, wrong, enc.wire_id, manifest)
            assert not d and d.code == SIZE_MISMATCH
    else:  # a size set by the values: the decoder refuses a payload cut short
        with pytest.raises(ValueError):
            enc.decode(payload[:-1], sizes, list(sd), scales)


@pytest.mark.parametrize("enc", encodings.REGISTRY, ids=lambda e: e.name)
def test_every_registered_encoding_refuses_a_value_that_is_not_finite(enc):
    bad = {"w": np.array([1e-3, np.nan, 2e-3], np.float32)}
    if enc.name in ("float32", "float16"):
        # Carried as is; the admission check refuses it after decoding (check_tensors).
        assert np.isnan(enc.roundtrip(bad)["w"][1])
        return
    with pytest.raises(ValueError, match="'w'"):
        enc.encode(bad)


def test_the_registry_resolves_names_ids_and_topk_fractions():
    assert encodings.resolve("topk:0.05").fraction == 0.05
    assert encodings.resolve("topk") == encodings.BY_NAME["topk"]
    assert encodings.by_wire_id(6).name == "int8_delta"
    assert encodings.DELTA_WIRE_IDS == {4, 6, 7}
    assert encodings.UPDATE_ENCODINGS == (
        "float32",
        "float16",
        "int8",
        "int8_block",
        "int4_block",
        "topk",
        "int8_delta",
        "int4_delta",
    )
    with pytest.raises(ValueError, match=r"unknown encoding 'int2'; expected one of \['float32'"):
        encodings.resolve("int2")
    with pytest.raises(ValueError, match="unknown payload encoding 9"):
        encodings.by_wire_id(9)
    with pytest.raises(ValueError, match=r"'topk:2'.*must be a number in \(0, 1\]"):
        encodings.resolve("topk:2")
    assert encodings.is_delta("topk:0.5") and not encodings.is_delta("int8_block")
    assert not encodings.is_delta("no_such_encoding")
