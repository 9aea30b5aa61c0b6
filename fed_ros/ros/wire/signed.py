"""Server-signed control messages on the wire (issue 13): round announcements and resend requests.

A message is signed over its own CDR serialisation with its ``signature`` field empty
(``auth.control_message``: CDR is deterministic for one message type, so every field,
including the header stamp, is covered). Resend requests are ``std_msgs/String`` JSON; they
carry ``sig`` (hex) over the canonical JSON of the other keys, and ``robot_id`` when a robot
signs one. Verification is the receiver's: ``verify_*`` return None or the refusal reason.
"""
from __future__ import annotations

import json
from typing import Any

from rclpy.serialization import serialize_message

from fed_ros.core import auth


def control_body(msg: Any) -> bytes:
    """CDR bytes of ``msg`` with its signature field empty (what is signed)."""
    saved = bytes(msg.signature)
    msg.signature = []
    try:
        return serialize_message(msg)
    finally:
        msg.signature = list(saved)


def sign_msg(msg: Any, kind: str, signer: auth.Signer | None) -> Any:
    """Put the server's signature of ``kind`` into ``msg.signature`` (nothing without a key)."""
    if signer is not None:
        msg.signature = list(signer.sign_control(kind, control_body(msg)))
    return msg


def verify_msg(msg: Any, kind: str, server_key: bytes | None) -> str | None:
    """None when ``msg`` carries the server's signature (or no server key is configured), else why not."""
    if server_key is None:
        return None
    if len(msg.signature) > auth.SIGNATURE_BYTES:
        return f"{kind}: signature of {len(msg.signature)} bytes"
    return auth.verify_control(server_key, kind, control_body(msg), bytes(msg.signature))


def _canonical(obj: dict[str, Any]) -> bytes:
    return json.dumps({k: v for k, v in obj.items() if k != "sig"}, sort_keys=True,
                      separators=(",", ":")).encode("utf-8")


def sign_json(text: str, kind: str, signer: auth.Signer | None, robot_id: str | None = None) -> str:
    """A JSON request with ``sig`` (and ``robot_id`` when a robot signs) added; unchanged without a key."""
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
        return f"{kind}: unknown sender {str(rid)[:64]!r}" if rid is not None else f"{kind}: no key to check it"
    return auth.verify_control(key, kind, _canonical(obj), sig)
