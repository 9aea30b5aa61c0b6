"""Server-signed control messages on the wire (issue 13): round announcements and resend requests.

A message is signed over a canonical encoding of every field but ``signature`` (its type
name, then each field in declaration order, nested messages and arrays included, floats exact
as ``float.hex``), so every field, including the header stamp, is covered. Not over its CDR
bytes: rmw's serializer leaves the alignment padding uninitialised (measured with the Kilted
wheels: a RoundAnnouncement serialised twice differed in the 3 bytes after ``stage``), so the
receiver's re-serialisation of a genuine announcement did not match what the server signed.
Resend requests are ``std_msgs/String`` JSON; they
carry ``sig`` (hex) over the canonical JSON of the other keys, and ``robot_id`` when a robot
signs one. Verification is the receiver's: ``verify_*`` return None or the refusal reason.
"""

from __future__ import annotations

import json
from typing import Any

from fed_ros.core.security import auth


def _canonical_value(value: Any) -> Any:
    """A ROS message value as plain JSON data, independent of memory layout (exact floats)."""
    if hasattr(value, "get_fields_and_field_types"):  # a nested message
        return [
            [name, _canonical_value(getattr(value, name))]
            for name in value.get_fields_and_field_types()
        ]
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    if isinstance(value, float):
        return value.hex()
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if hasattr(value, "tolist"):  # array.array (sequences) and numpy arrays (fixed-size arrays)
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return [_canonical_value(v) for v in value]
    raise TypeError(f"cannot sign a field of type {type(value).__name__}")


def control_body(msg: Any) -> bytes:
    """What is signed: ``msg``'s type and every field except ``signature``, canonically encoded."""
    fields = [
        [name, _canonical_value(getattr(msg, name))]
        for name in msg.get_fields_and_field_types()
        if name != "signature"
    ]
    return json.dumps([type(msg).__name__, fields], separators=(",", ":")).encode("utf-8")


def sign_msg(msg: Any, kind: str, signer: auth.Signer | None) -> Any:
    """Put the server's signature of ``kind`` into ``msg.signature`` (nothing without a key)."""
    if signer is not None:
        msg.signature = list(signer.sign_control(kind, control_body(msg)))
    return msg


def verify_msg(msg: Any, kind: str, server_key: bytes | None) -> str | None:
    """None when ``msg`` carries the server's signature (or no server key is configured), else why
    not."""
    if server_key is None:
        return None
    if len(msg.signature) > auth.SIGNATURE_BYTES:
        return f"{kind}: signature of {len(msg.signature)} bytes"
    return auth.verify_control(server_key, kind, control_body(msg), bytes(msg.signature))


def _canonical(obj: dict[str, Any]) -> bytes:
    return json.dumps(
        {k: v for k, v in obj.items() if k != "sig"}, sort_keys=True, separators=(",", ":")
    ).encode("utf-8")


def sign_json(text: str, kind: str, signer: auth.Signer | None, robot_id: str | None = None) -> str:
    """A JSON request with ``sig`` (and ``robot_id`` when a robot signs) added; unchanged without a
    key."""
    if signer is None:
        return text
    obj = json.loads(text)
    if robot_id is not None:
        obj["robot_id"] = robot_id
    obj["sig"] = signer.sign_control(kind, _canonical(obj)).hex()
    return json.dumps(obj)


def verify_json(text: str, kind: str, key_for: Any) -> str | None:
    """None when the JSON request is signed by ``key_for(obj)`` (a raw public key), else the reason.

    ``key_for`` picks the key from the request (the server's key, or a robot's by its ``robot_id``)
    and returns None for a sender it does not know.
    """
    try:
        obj = json.loads(text)
        sig = bytes.fromhex(obj.get("sig", "")) if isinstance(obj, dict) else b""
    except (ValueError, TypeError, AttributeError):
        return f"{kind}: malformed request"
    key = key_for(obj)
    if key is None:
        rid = obj.get("robot_id")
        return (
            f"{kind}: unknown sender {str(rid)[:64]!r}"
            if rid is not None
            else f"{kind}: no key to check it"
        )
    return auth.verify_control(key, kind, _canonical(obj), sig)
