"""Authenticity for the fleet: Ed25519 keys, signed updates/descriptors, allow-lists, replay guard.

Every robot owns an Ed25519 key pair. A robot signs a *canonical byte string* built from the
round, its robot id, a fresh random nonce and the SHA-256 of what it sends (the encoded
payload of a ``ModelUpdate``, or the digest of a ``ClientDescriptor``). The server keeps an
allow-list (robot id -> raw 32-byte public key) and rejects unknown robots, bad signatures,
old rounds and reused nonces. The server may sign the cluster models it publishes so robots
never load a model that did not come from their server.

Keys on disk: the private key is a PKCS#8 PEM file written with mode 0600 (refused on load
when group/other can read it, as ssh does); the public key is one line of hex (64 chars) that
can be pasted into the allow-list YAML. Their encoding and files are
:mod:`fed_ros.core.security.keys`; ``fed-ros keys`` (:mod:`fed_ros.core.security.key_admin`)
manages both.

The canonical byte strings and digests are built in
:mod:`fed_ros.core.security.signed_messages`, the replay guard is
:mod:`fed_ros.core.security.replay`.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from fed_ros.core.security.keys import (
    load_private_key,
    public_key_from_bytes,
    raw_public_key,
    save_private_key,
)
from fed_ros.core.security.signed_messages import (
    cluster_model_message,
    control_message,
    descriptor_message,
    progress_message,
    robot_id_bytes,
    update_message,
)

SIGNATURE_BYTES = 64


# ----------------------------------------------------------------------------- signatures


def verify_signature(
    public_key: bytes | Ed25519PublicKey, message: bytes, signature: bytes
) -> bool:
    """True iff `signature` is a valid Ed25519 signature of `message` under `public_key`."""
    if (
        not isinstance(signature, (bytes, bytearray, memoryview))
        or len(signature) != SIGNATURE_BYTES
    ):
        return False
    try:
        key = (
            public_key
            if isinstance(public_key, Ed25519PublicKey)
            else public_key_from_bytes(public_key)
        )
        key.verify(bytes(signature), message)
    except (InvalidSignature, ValueError):
        return False
    return True


@dataclass(frozen=True)
class Signer:
    """A private key with the signing helpers robots and the server use."""

    private_key: Ed25519PrivateKey

    @classmethod
    def generate(cls) -> "Signer":
        """A fresh random key pair."""
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_file(cls, path: str | Path) -> "Signer":
        """Load a PEM private key written by ``save``/``fed-ros keys``.

        Refuses group/other-readable files.
        """
        return cls(load_private_key(path))

    @property
    def public_key(self) -> bytes:
        """Raw 32-byte public key (what Register.public_key and the allow-list carry)."""
        return raw_public_key(self.private_key)

    def sign(self, message: bytes) -> bytes:
        """64-byte Ed25519 signature of `message`."""
        return self.private_key.sign(message)

    def sign_update(
        self,
        round_idx: int,
        robot_id: str,
        nonce: bytes,
        payload_sha256: str | bytes,
        *,
        base_round: int,
        num_samples: int,
        cluster_id: int,
        transfer: bytes = b"",
    ) -> bytes:
        """Signature for ModelUpdate.signature (see ``update_message``)."""
        return self.sign(
            update_message(
                round_idx,
                robot_id,
                nonce,
                payload_sha256,
                base_round=base_round,
                num_samples=num_samples,
                cluster_id=cluster_id,
                transfer=transfer,
            )
        )

    def sign_descriptor(
        self, round_idx: int, robot_id: str, nonce: bytes, digest: str | bytes
    ) -> bytes:
        """Signature for ClientDescriptor.signature (digest from ``descriptor_digest``)."""
        return self.sign(descriptor_message(round_idx, robot_id, nonce, digest))

    def sign_progress(
        self, round_idx: int, robot_id: str, seq: int, steps_done: int, expected_steps: int
    ) -> bytes:
        """Signature for TrainingProgress.signature (see ``progress_message``)."""
        return self.sign(progress_message(round_idx, robot_id, seq, steps_done, expected_steps))

    def sign_cluster_model(
        self,
        round_idx: int,
        cluster_id: int,
        payload_sha256: str | bytes,
        *,
        transfer: bytes = b"",
        members: Sequence[str] = (),
    ) -> bytes:
        """Server signature for ClusterModel.signature (see ``cluster_model_message``)."""
        return self.sign(
            cluster_model_message(
                round_idx, cluster_id, payload_sha256, transfer=transfer, members=members
            )
        )

    def sign_control(self, kind: str, body: bytes) -> bytes:
        """Server signature of a control message (see ``control_message``)."""
        return self.sign(control_message(kind, body))

    def save(self, path: str | Path) -> Path:
        """Write the private key (PKCS#8 PEM, mode 0600) and `<path>.pub` (hex).

        Returns the key path.
        """
        return save_private_key(self.private_key, path)


# ----------------------------------------------------------------------------- allow-list


class AllowList:
    """The robots (and server) whose public keys the fleet trusts.

    YAML form (``fed-ros keys`` writes it)::

        server: <64 hex chars>        # optional: robots verify cluster models with it
        robots:
          robot_0: <64 hex chars>
    """

    def __init__(
        self, robots: Mapping[str, bytes | str] | None = None, server: bytes | str | None = None
    ):
        self._robots: dict[str, bytes] = {}
        for robot_id, key in (robots or {}).items():
            self.add(robot_id, key)
        self.server: bytes | None = (
            None if server in (None, "") else raw_public_key(public_key_from_bytes(server))
        )

    @classmethod
    def from_yaml(cls, path: str | Path) -> "AllowList":
        """Load an allow-list YAML (yaml.safe_load); ValueError names the bad entry."""
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"allow-list file not found: {str(path)!r}")
        data = yaml.safe_load(path.read_text()) or {}
        if not isinstance(data, dict):
            raise ValueError(
                f"allow-list {str(path)!r} must be a mapping, got {type(data).__name__}"
            )
        unknown = set(data) - {"robots", "server"}
        if unknown:
            raise ValueError(f"allow-list {str(path)!r}: unknown keys {sorted(map(str, unknown))}")
        robots = data.get("robots") or {}
        if not isinstance(robots, dict):
            raise ValueError(f"allow-list {str(path)!r}: 'robots' must map robot id -> hex key")
        try:
            out = cls(server=data.get("server"))
        except ValueError as err:
            raise ValueError(f"allow-list {str(path)!r}, server: {err}") from None
        for robot_id, key in robots.items():
            try:
                out.add(str(robot_id), str(key))
            except ValueError as err:
                raise ValueError(f"allow-list {str(path)!r}, robot {robot_id!r}: {err}") from None
        return out

    def to_yaml(self, path: str | Path) -> Path:
        """Write the allow-list atomically as YAML; returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        data: dict[str, Any] = {}
        if self.server is not None:
            data["server"] = self.server.hex()
        data["robots"] = {rid: key.hex() for rid, key in sorted(self._robots.items())}
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(
            "# fed_ros allow-list: robot id -> raw Ed25519 public key (hex).\n"
            + yaml.safe_dump(data, sort_keys=False)
        )
        os.replace(tmp, path)
        return path

    def add(self, robot_id: str, key: bytes | str) -> None:
        """Trust `robot_id` with public key `key` (raw bytes or hex)."""
        robot_id_bytes(robot_id)
        self._robots[robot_id] = raw_public_key(public_key_from_bytes(key))

    def remove(self, robot_id: str) -> None:
        """Revoke a robot; KeyError-free (ValueError if it was not listed)."""
        if robot_id not in self._robots:
            raise ValueError(f"robot {robot_id!r} is not on the allow-list")
        del self._robots[robot_id]

    def public_key(self, robot_id: str) -> bytes | None:
        """The robot's raw public key, or None when it is not allowed."""
        return self._robots.get(robot_id)

    def __contains__(self, robot_id: object) -> bool:
        return robot_id in self._robots

    def __len__(self) -> int:
        return len(self._robots)

    @property
    def robot_ids(self) -> list[str]:
        """Allowed robot ids, sorted."""
        return sorted(self._robots)

    def key_matches(self, robot_id: str, public_key: bytes) -> bool:
        """Whether a registering robot presents the allow-listed key (constant-time compare)."""
        known = self._robots.get(robot_id)
        return known is not None and hmac.compare_digest(known, bytes(public_key))

    def verify_update(
        self,
        robot_id: str,
        round_idx: int,
        nonce: bytes,
        payload_sha256: str | bytes,
        signature: bytes,
        *,
        base_round: int,
        num_samples: int,
        cluster_id: int,
        transfer: bytes = b"",
    ) -> str | None:
        """None if the update signature is valid, else the reject reason."""
        return self._verify(
            robot_id,
            signature,
            lambda: update_message(
                round_idx,
                robot_id,
                nonce,
                payload_sha256,
                base_round=base_round,
                num_samples=num_samples,
                cluster_id=cluster_id,
                transfer=transfer,
            ),
        )

    def verify_descriptor(
        self, robot_id: str, round_idx: int, nonce: bytes, digest: str | bytes, signature: bytes
    ) -> str | None:
        """None if the descriptor signature is valid, else the reject reason."""
        return self._verify(
            robot_id, signature, lambda: descriptor_message(round_idx, robot_id, nonce, digest)
        )

    def verify_progress(
        self,
        robot_id: str,
        round_idx: int,
        seq: int,
        steps_done: int,
        expected_steps: int,
        signature: bytes,
    ) -> str | None:
        """None if the heartbeat signature is valid, else the reject reason."""
        return self._verify(
            robot_id,
            signature,
            lambda: progress_message(round_idx, robot_id, seq, steps_done, expected_steps),
        )

    def _verify(self, robot_id: str, signature: bytes, build: Callable[[], bytes]) -> str | None:
        key = self._robots.get(robot_id)
        if key is None:
            return f"unknown robot {robot_id!r}: no public key on the allow-list"
        if not signature:
            return f"robot {robot_id!r}: update is not signed"
        try:
            message = build()
        except ValueError as err:
            return f"robot {robot_id!r}: cannot build signed message: {err}"
        if not verify_signature(key, message, signature):
            return f"robot {robot_id!r}: bad signature ({len(signature)} bytes)"
        return None


def verify_control(
    server_key: bytes | None, kind: str, body: bytes, signature: bytes
) -> str | None:
    """Robot side: None if a control message carries the server's valid signature, else the reason.

    ``server_key`` None means no server key is configured: nothing is checked (the robot then
    trusts any participant on the domain; docs/security.md says what that means).
    """
    if server_key is None:
        return None
    if not signature:
        return f"{kind}: not signed by the server"
    if not verify_signature(server_key, control_message(kind, body), bytes(signature)):
        return f"{kind}: bad server signature ({len(signature)} bytes)"
    return None
