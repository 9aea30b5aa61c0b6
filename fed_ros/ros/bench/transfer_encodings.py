"""`fed-ros bench transfer --shaped R --shaped-encodings E,...`: a robot's update through a shaped
link, end to end, per update encoding.

For each encoding the payload is a real policy's update (the initial model of ``--shaped-policy``
plus a trained-like change), encoded as a robot encodes it (the delta encodings, ``topk``,
``int8_delta``, ``int4_delta``, with its error feedback), sent through the tbf-shaped link by the
chosen transport methods, and decoded as the server decodes it (a delta: added to the start
model). The end-to-end time is encode + the median
transfer + decode, each measured here; the bytes are the encoded payload's.
"""

from __future__ import annotations

import argparse
import time
from typing import Any, Callable

import numpy as np


def encode_update(
    start: dict[str, np.ndarray], trained: dict[str, np.ndarray], encoding: str
) -> Any:
    """The EncodedPayload a robot sends for ``trained`` under ``encoding`` (a delta encoding:
    against ``start``, with a fresh error feedback)."""
    from fed_ros.core import encodings
    from fed_ros.core.encodings.feedback import ErrorFeedback
    from fed_ros.ros.wire.tensors import decode_state_dict, encode_state_dict

    enc = encodings.resolve(encoding)
    if not enc.delta:
        return encode_state_dict(trained, encoding)
    feedback = ErrorFeedback()
    full = feedback.delta_to_send(trained, start)
    payload = encode_state_dict(full, enc)
    sent = decode_state_dict(payload.manifest, payload.encoding, payload.data, copy=True)
    feedback.keep_unsent(full, sent)
    return payload


def noisy_update(policy: str, seed: int = 0) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(start, trained) of ``policy`` (lowdim, image): its initial model, and that model plus
    i.i.d. Gaussian noise (1e-3), a stand-in for training that deflates less than a trained
    change does."""
    from fed_ros.learning.configuration_policy import PolicyConfig
    from fed_ros.learning.trainer import initial_state_dict

    start = initial_state_dict(PolicyConfig(kind=policy), seed=seed)
    rng = np.random.default_rng(seed)
    trained = {
        k: v + rng.normal(scale=1e-3, size=v.shape).astype(np.float32) for k, v in start.items()
    }
    return start, trained


def encoded_update(policy: str, encoding: str, seed: int = 0) -> dict[str, Any]:
    """Encode and decode one update of ``policy`` (lowdim, image) under ``encoding``; returns its
    bytes and the encode and decode seconds."""
    from fed_ros.core.encodings import is_delta
    from fed_ros.core.encodings.feedback import apply_delta
    from fed_ros.ros.wire.tensors import decode_state_dict

    start, trained = noisy_update(policy, seed)
    delta = is_delta(encoding)
    t0 = time.perf_counter()
    payload = encode_update(start, trained, encoding)
    t1 = time.perf_counter()
    received = decode_state_dict(payload.manifest, payload.encoding, payload.data, payload.scales)
    if delta:
        received, _ = apply_delta(start, received, 0)
    t2 = time.perf_counter()
    return {
        "encoding": encoding,
        "bytes": payload.total_bytes,
        "encode_s": t1 - t0,
        "decode_s": t2 - t1,
    }


def shaped_per_encoding(
    args: argparse.Namespace, shaped: Callable[[argparse.Namespace], list[dict[str, Any]]]
) -> list[dict[str, Any]]:
    """``shaped`` (the bench's shaped-link run) once per encoding, with that update's size."""
    rows = []
    for encoding in [e.strip() for e in args.shaped_encodings.split(",") if e.strip()]:
        update = encoded_update(args.shaped_policy, encoding)
        print(
            f"\n{args.shaped_policy} policy update as {encoding}: {update['bytes'] / 1e6:.3f} MB, "
            f"encode {update['encode_s'] * 1e3:.0f} ms, decode {update['decode_s'] * 1e3:.0f} ms"
        )
        sub = argparse.Namespace(**{**vars(args), "shaped_mb": update["bytes"] / 1e6})
        for row in shaped(sub):
            med = row["median_s"]
            end_to_end = None if med is None else update["encode_s"] + med + update["decode_s"]
            rows.append({**row, **update, "end_to_end_s": end_to_end})
    print(f"\n{args.shaped_policy} policy update, end to end (encode + transfer + decode):")
    print(f"{'link':>9} {'method':<13} {'encoding':<12} {'MB':>8} {'end to end s':>13}")
    for row in rows:
        e2e = "-" if row["end_to_end_s"] is None else f"{row['end_to_end_s']:.2f}"
        print(
            f"{row['rate_mbit']:>6g} Mb {row['method']:<13} {row['encoding']:<12} "
            f"{row['bytes'] / 1e6:>8.3f} {e2e:>13}"
        )
    return rows
