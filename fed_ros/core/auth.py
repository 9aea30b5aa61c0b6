"""Authenticity for the fleet: Ed25519 keys, signed updates/descriptors, allow-lists, replay guard.

Every robot owns an Ed25519 key pair. A robot signs a *canonical byte string* built from the
round, its robot id, a fresh random nonce and the SHA-256 of what it sends (the encoded
payload of a ``ModelUpdate``, or the digest of a ``ClientDescriptor``). The server keeps an
allow-list (robot id -> raw 32-byte public key) and rejects unknown robots, bad signatures,
old rounds and reused nonces. The server may sign the cluster models it publishes so robots
never load a model that did not come from their server.

Keys on disk: the private key is a PKCS#8 PEM file written with mode 0600 (refused on load
when group/other can read it, as ssh does); the public key is one line of hex (64 chars) that
can be pasted into the allow-list YAML. ``fed-ros keys`` (``keys_main``) manages both.
"""
from __future__ import annotations

import argparse
import hashlib
import hmac
import math
import os
import stat
import struct
import sys
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

PUBLIC_KEY_BYTES = 32
SIGNATURE_BYTES = 64
NONCE_BYTES = 16
# Domain-separation tags: a signature made for one kind of message can never be
# replayed as another kind (an update signature is not a valid descriptor signature).
_TAG_UPDATE = b"fed_ros/update/v2"
_TAG_DESCRIPTOR = b"fed_ros/descriptor/v1"
_TAG_CLUSTER_MODEL = b"fed_ros/cluster_model/v2"
_TAG_TRANSFER = b"fed_ros/transfer/v1"
_TAG_CONTROL = b"fed_ros/control/v1"
_MAX_ID_BYTES = 255  # robot ids are short names; longer ones are refused, not truncated


# ----------------------------------------------------------------------------- encoding

def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _check_int32(value: int, what: str) -> int:
    if not _is_int(value) or not -2**31 <= int(value) < 2**31:
        raise ValueError(f"{what} must be an int32, got {value!r}")
    return int(value)


def _check_round(round_idx: int, what: str = "round") -> int:
    if not _is_int(round_idx):
        raise ValueError(f"{what} must be an integer, got {round_idx!r}")
    if not 0 <= int(round_idx) < 2**32:
        raise ValueError(f"{what} must be in [0, 2**32), got {round_idx!r}")
    return int(round_idx)


def _id_bytes(robot_id: str) -> bytes:
    if not isinstance(robot_id, str) or not robot_id:
        raise ValueError(f"robot id must be a non-empty string, got {robot_id!r}")
    raw = robot_id.encode("utf-8")
    if len(raw) > _MAX_ID_BYTES:
        raise ValueError(f"robot id longer than {_MAX_ID_BYTES} bytes: {robot_id[:40]!r}...")
    return raw


def _digest_bytes(digest: str | bytes, what: str) -> bytes:
    """A SHA-256 digest given as 32 raw bytes or 64 hex characters -> 32 raw bytes."""
    if isinstance(digest, (bytes, bytearray, memoryview)):
        raw = bytes(digest)
    elif isinstance(digest, str):
        try:
            raw = bytes.fromhex(digest)
        except ValueError:
            raise ValueError(f"{what} is not hex: {digest[:80]!r}") from None
    else:
        raise ValueError(f"{what} must be hex str or bytes, got {type(digest).__name__}")
    if len(raw) != 32:
        raise ValueError(f"{what} must be 32 bytes (sha256), got {len(raw)}")
    return raw


def _nonce_bytes(nonce: bytes) -> bytes:
    if not isinstance(nonce, (bytes, bytearray, memoryview)):
        raise ValueError(f"nonce must be bytes, got {type(nonce).__name__}")
    nonce = bytes(nonce)
    if len(nonce) != NONCE_BYTES:
        raise ValueError(f"nonce must be {NONCE_BYTES} bytes, got {len(nonce)}")
    return nonce


def _blob(data: bytes | str) -> bytes:
    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    return struct.pack("<Q", len(raw)) + raw


def transfer_digest(*, payload_id: str, encoding: int, total_bytes: int, chunk_count: int,
                    manifest: Sequence[tuple[str, Sequence[int], str]], scales: bytes = b"",
                    chunk_sha256: bytes = b"", bulk_uri: str = "") -> bytes:
    """SHA-256 over everything a payload's header tells its receiver (what a signature must cover).

    Payload id, encoding, size, chunk count, the manifest (names, shapes, dtypes: they decide what
    the bytes mean), int8 scales, the per-chunk SHA-256 list (so every chunk is checked before it
    is kept) and the bulk channel address (so a receiver connects only where the signer said).
    """
    if not _is_int(total_bytes) or not 0 <= int(total_bytes) < 2**64:
        raise ValueError(f"total_bytes must be a uint64, got {total_bytes!r}")
    if not _is_int(chunk_count) or not 0 <= int(chunk_count) < 2**32:
        raise ValueError(f"chunk_count must be a uint32, got {chunk_count!r}")
    chunk_sha256 = bytes(chunk_sha256)
    if len(chunk_sha256) % 32:
        raise ValueError(f"chunk_sha256 must be 32 bytes per chunk, got {len(chunk_sha256)} bytes")
    h = hashlib.sha256(_TAG_TRANSFER)
    h.update(_blob(payload_id) + struct.pack("<BQI", int(encoding) & 0xFF, int(total_bytes), int(chunk_count)))
    h.update(struct.pack("<Q", len(manifest)))
    for name, shape, dtype in manifest:
        shape = tuple(int(d) for d in shape)
        h.update(_blob(str(name)) + _blob(str(dtype)) + struct.pack(f"<Q{len(shape)}q", len(shape), *shape))
    h.update(_blob(bytes(scales)) + _blob(chunk_sha256) + _blob(bulk_uri))
    return h.digest()


def update_message(round_idx: int, robot_id: str, nonce: bytes, payload_sha256: str | bytes, *,
                   base_round: int, num_samples: int, cluster_id: int, transfer: bytes = b"") -> bytes:
    """Canonical bytes a robot signs for a model update.

    (round, robot id, nonce, payload sha256) as the design asks, plus the header fields that
    steer aggregation (base round, sample count = aggregation weight, chosen cluster), so a
    man in the middle cannot re-weight or re-route a genuine update, plus ``transfer``: the
    ``transfer_digest`` of the payload header (payload id, manifest, chunk list, bulk address),
    so no chunk or bulk endpoint that the robot did not name can enter its upload.
    """
    rid = _id_bytes(robot_id)
    if not _is_int(num_samples) or not 0 <= int(num_samples) < 2**64:
        raise ValueError(f"num_samples must be a uint64, got {num_samples!r}")
    return b"".join((_TAG_UPDATE, struct.pack("<IB", _check_round(round_idx), len(rid)), rid,
                     _nonce_bytes(nonce), _digest_bytes(payload_sha256, "payload sha256"),
                     struct.pack("<IQi", _check_round(base_round, "base_round"), int(num_samples),
                                 _check_int32(cluster_id, "cluster id")), _blob(transfer)))


def descriptor_message(round_idx: int, robot_id: str, nonce: bytes, descriptor_sha256: str | bytes) -> bytes:
    """Canonical bytes a robot signs for a descriptor: (round, robot id, nonce, descriptor digest)."""
    rid = _id_bytes(robot_id)
    return b"".join((_TAG_DESCRIPTOR, struct.pack("<IB", _check_round(round_idx), len(rid)), rid,
                     _nonce_bytes(nonce), _digest_bytes(descriptor_sha256, "descriptor digest")))


def cluster_model_message(round_idx: int, cluster_id: int, payload_sha256: str | bytes, *,
                          transfer: bytes = b"", members: Sequence[str] = ()) -> bytes:
    """Canonical bytes the server signs for a published cluster model.

    (round, cluster id, sha256), the member robots (robots pick their model by membership) and
    ``transfer`` (the payload header's ``transfer_digest``: chunk list, bulk address, manifest).
    """
    return b"".join((_TAG_CLUSTER_MODEL, struct.pack("<Ii", _check_round(round_idx),
                                                     _check_int32(cluster_id, "cluster id")),
                     _digest_bytes(payload_sha256, "payload sha256"), _blob(transfer),
                     struct.pack("<Q", len(members)), *(_blob(str(m)) for m in members)))


def control_message(kind: str, body: bytes) -> bytes:
    """Canonical bytes the server signs for a control message (round announcement, resend request).

    ``body`` is the message's own serialisation with its signature field empty (the ROS layer
    uses the CDR bytes, deterministic for one message type); ``kind`` separates the domains.
    """
    return _TAG_CONTROL + _blob(kind) + _blob(body)


def _f32(values: Any, what: str) -> bytes:
    if values is None:
        return struct.pack("<q", 0)
    with np.errstate(over="ignore", invalid="ignore"):  # out-of-range values become inf, as on the wire
        arr = np.ascontiguousarray(np.asarray(values, dtype="<f4").ravel())
    # An absent vector and an empty one travel the same way (an empty float32[]): same bytes.
    # NaNs have many bit patterns; canonicalise so both ends hash the same bytes.
    if not np.all(np.isfinite(arr)):
        arr = arr.copy()
        arr[np.isnan(arr)] = np.float32("nan")
    return struct.pack("<q", arr.size) + arr.tobytes()


def descriptor_digest(*, kind: str, dims: int, mean: Any, variance: Any, num_samples: int,
                      payload: bytes = b"", scores: Mapping[str, float] | None = None,
                      residual_std: float = math.nan) -> bytes:
    """SHA-256 over a canonical encoding of a descriptor's content (float32, sorted scores)."""
    h = hashlib.sha256()
    kind_b = str(kind).encode("utf-8")
    h.update(struct.pack("<H", len(kind_b)) + kind_b)
    h.update(struct.pack("<QQ", int(dims) & (2**64 - 1), int(num_samples) & (2**64 - 1)))
    h.update(_f32(mean, "mean"))
    h.update(_f32(variance, "variance"))
    payload = bytes(payload or b"")
    h.update(struct.pack("<Q", len(payload)) + payload)
    items = sorted((scores or {}).items())
    h.update(struct.pack("<Q", len(items)))
    for rid, value in items:
        rb = str(rid).encode("utf-8")
        h.update(struct.pack("<H", len(rb)) + rb + _f32([value], "score"))
    h.update(_f32([residual_std], "residual_std"))
    return h.digest()


def new_nonce() -> bytes:
    """A fresh random 16-byte nonce (os.urandom)."""
    return os.urandom(NONCE_BYTES)


def sha256_hex(data: bytes | memoryview | np.ndarray) -> str:
    """Lower-case hex SHA-256 of a byte buffer (what TensorPayload.sha256 carries)."""
    return hashlib.sha256(data).hexdigest()


# ----------------------------------------------------------------------------- keys

def public_key_from_bytes(raw: bytes | str) -> Ed25519PublicKey:
    """A public key from 32 raw bytes or 64 hex chars; ValueError names the bad value."""
    if isinstance(raw, str):
        try:
            raw = bytes.fromhex(raw.strip())
        except ValueError:
            raise ValueError(f"public key is not hex: {raw[:80]!r}") from None
    if not isinstance(raw, (bytes, bytearray, memoryview)) or len(raw) != PUBLIC_KEY_BYTES:
        size = len(raw) if isinstance(raw, (bytes, bytearray, memoryview)) else type(raw).__name__
        raise ValueError(f"public key must be {PUBLIC_KEY_BYTES} raw bytes, got {size}")
    return Ed25519PublicKey.from_public_bytes(bytes(raw))


def raw_public_key(key: Ed25519PrivateKey | Ed25519PublicKey) -> bytes:
    """The raw 32-byte encoding of a (private key's) public key."""
    pub = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def verify_signature(public_key: bytes | Ed25519PublicKey, message: bytes, signature: bytes) -> bool:
    """True iff `signature` is a valid Ed25519 signature of `message` under `public_key`."""
    if not isinstance(signature, (bytes, bytearray, memoryview)) or len(signature) != SIGNATURE_BYTES:
        return False
    try:
        key = public_key if isinstance(public_key, Ed25519PublicKey) else public_key_from_bytes(public_key)
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
        """Load a PEM private key written by ``save``/``fed-ros keys`` (refuses group/other-readable files)."""
        return cls(load_private_key(path))

    @property
    def public_key(self) -> bytes:
        """Raw 32-byte public key (what Register.public_key and the allow-list carry)."""
        return raw_public_key(self.private_key)

    def sign(self, message: bytes) -> bytes:
        """64-byte Ed25519 signature of `message`."""
        return self.private_key.sign(message)

    def sign_update(self, round_idx: int, robot_id: str, nonce: bytes, payload_sha256: str | bytes, *,
                    base_round: int, num_samples: int, cluster_id: int, transfer: bytes = b"") -> bytes:
        """Signature for ModelUpdate.signature (see ``update_message``)."""
        return self.sign(update_message(round_idx, robot_id, nonce, payload_sha256, base_round=base_round,
                                        num_samples=num_samples, cluster_id=cluster_id, transfer=transfer))

    def sign_descriptor(self, round_idx: int, robot_id: str, nonce: bytes, digest: str | bytes) -> bytes:
        """Signature for ClientDescriptor.signature (digest from ``descriptor_digest``)."""
        return self.sign(descriptor_message(round_idx, robot_id, nonce, digest))

    def sign_cluster_model(self, round_idx: int, cluster_id: int, payload_sha256: str | bytes, *,
                           transfer: bytes = b"", members: Sequence[str] = ()) -> bytes:
        """Server signature for ClusterModel.signature (see ``cluster_model_message``)."""
        return self.sign(cluster_model_message(round_idx, cluster_id, payload_sha256, transfer=transfer,
                                               members=members))

    def sign_control(self, kind: str, body: bytes) -> bytes:
        """Server signature of a control message (see ``control_message``)."""
        return self.sign(control_message(kind, body))

    def save(self, path: str | Path) -> Path:
        """Write the private key (PKCS#8 PEM, mode 0600) and `<path>.pub` (hex); returns the key path."""
        return save_private_key(self.private_key, path)


def save_private_key(key: Ed25519PrivateKey, path: str | Path) -> Path:
    """Write `key` as PEM with mode 0600 atomically, plus the hex public key next to it (`.pub`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    tmp = path.with_name(path.name + ".tmp")
    # O_EXCL + mode 0600 at creation: the secret is never on disk with wider permissions.
    if tmp.exists():
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, pem)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    pub_path = public_key_path(path)
    pub_path.write_text(raw_public_key(key).hex() + "\n")
    return path


def public_key_path(private_key_path: str | Path) -> Path:
    """Where the public key of a private key file lives (`<name>.pub` beside `<name>.key`)."""
    p = Path(private_key_path)
    return p.with_suffix(".pub") if p.suffix == ".key" else p.with_name(p.name + ".pub")


def load_private_key(path: str | Path) -> Ed25519PrivateKey:
    """Load an Ed25519 PEM private key; ValueError if missing, group/other-readable or not Ed25519."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"private key file not found: {str(path)!r}")
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise ValueError(f"private key {str(path)!r} has mode {mode:04o}; it must not be readable by "
                         f"group/others (chmod 600 {path})")
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"private key {str(path)!r} is {type(key).__name__}, not Ed25519")
    return key


def load_public_key(path_or_hex: str | Path) -> bytes:
    """Raw public key from a `.pub` hex file or a hex string."""
    text = str(path_or_hex)
    if Path(text).is_file():
        text = Path(text).read_text().strip()
    return raw_public_key(public_key_from_bytes(text))


# ----------------------------------------------------------------------------- allow-list

class AllowList:
    """The robots (and server) whose public keys the fleet trusts.

    YAML form (``fed-ros keys`` writes it)::

        server: <64 hex chars>        # optional: robots verify cluster models with it
        robots:
          robot_0: <64 hex chars>
    """

    def __init__(self, robots: Mapping[str, bytes | str] | None = None, server: bytes | str | None = None):
        self._robots: dict[str, bytes] = {}
        for robot_id, key in (robots or {}).items():
            self.add(robot_id, key)
        self.server: bytes | None = None if server in (None, "") else raw_public_key(public_key_from_bytes(server))

    @classmethod
    def from_yaml(cls, path: str | Path) -> "AllowList":
        """Load an allow-list YAML (yaml.safe_load); ValueError names the bad entry."""
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"allow-list file not found: {str(path)!r}")
        data = yaml.safe_load(path.read_text()) or {}
        if not isinstance(data, dict):
            raise ValueError(f"allow-list {str(path)!r} must be a mapping, got {type(data).__name__}")
        unknown = set(data) - {"robots", "server"}
        if unknown:
            raise ValueError(f"allow-list {str(path)!r}: unknown keys {sorted(map(str, unknown))}")
        robots = data.get("robots") or {}
        if not isinstance(robots, dict):
            raise ValueError(f"allow-list {str(path)!r}: 'robots' must map robot id -> hex key")
        out = cls(server=data.get("server"))
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
        tmp.write_text("# fed_ros allow-list: robot id -> raw Ed25519 public key (hex).\n"
                       + yaml.safe_dump(data, sort_keys=False))
        os.replace(tmp, path)
        return path

    def add(self, robot_id: str, key: bytes | str) -> None:
        """Trust `robot_id` with public key `key` (raw bytes or hex)."""
        _id_bytes(robot_id)
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

    def verify_update(self, robot_id: str, round_idx: int, nonce: bytes, payload_sha256: str | bytes,
                      signature: bytes, *, base_round: int, num_samples: int, cluster_id: int,
                      transfer: bytes = b"") -> str | None:
        """None if the update signature is valid, else the reject reason."""
        return self._verify(robot_id, signature, lambda: update_message(
            round_idx, robot_id, nonce, payload_sha256, base_round=base_round, num_samples=num_samples,
            cluster_id=cluster_id, transfer=transfer))

    def verify_descriptor(self, robot_id: str, round_idx: int, nonce: bytes, digest: str | bytes,
                          signature: bytes) -> str | None:
        """None if the descriptor signature is valid, else the reject reason."""
        return self._verify(robot_id, signature,
                            lambda: descriptor_message(round_idx, robot_id, nonce, digest))

    def _verify(self, robot_id: str, signature: bytes, build) -> str | None:
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


def verify_control(server_key: bytes | None, kind: str, body: bytes, signature: bytes) -> str | None:
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


# ----------------------------------------------------------------------------- replay guard

class ReplayGuard:
    """Rejects updates of rounds below a floor and reused nonces, with bounded memory.

    ``check`` is pure; ``record`` stores an accepted nonce. Nonces of rounds below the floor are
    forgotten because such rounds are rejected anyway. When more than ``max_nonces`` are held the
    oldest are evicted and the floor rises past them, so an evicted nonce can never be replayed.
    """

    def __init__(self, max_nonces: int = 100_000, window_rounds: int = 1):
        if max_nonces < 1:
            raise ValueError(f"max_nonces must be >= 1, got {max_nonces}")
        if window_rounds < 1:
            raise ValueError(f"window_rounds must be >= 1, got {window_rounds}")
        self.max_nonces = int(max_nonces)
        self.window_rounds = int(window_rounds)
        self.floor = 0  # lowest round still accepted
        self._nonces: OrderedDict[bytes, int] = OrderedDict()  # nonce -> round, insertion order

    def advance(self, current_round: int) -> None:
        """Start `current_round`: rounds older than the window are rejected from now on."""
        new_floor = max(self.floor, int(current_round) - self.window_rounds + 1)
        if new_floor != self.floor:
            self.floor = new_floor
            for nonce in [n for n, r in self._nonces.items() if r < new_floor]:
                del self._nonces[nonce]

    def check(self, robot_id: str, round_idx: int, nonce: bytes) -> str | None:
        """None if (round, nonce) is fresh, else the reject reason; changes nothing."""
        if round_idx < self.floor:
            return f"robot {robot_id!r}: round {round_idx} is older than the oldest open round {self.floor}"
        key = bytes(nonce)
        if len(key) != NONCE_BYTES:
            return f"robot {robot_id!r}: nonce must be {NONCE_BYTES} bytes, got {len(key)}"
        if key in self._nonces:
            return f"robot {robot_id!r}: nonce {key.hex()} already used (replay)"
        return None

    def record(self, robot_id: str, round_idx: int, nonce: bytes) -> None:
        """Remember an accepted nonce; evicts the oldest beyond `max_nonces` and raises the floor."""
        self._nonces[bytes(nonce)] = int(round_idx)
        while len(self._nonces) > self.max_nonces:
            _, evicted_round = self._nonces.popitem(last=False)
            self.floor = max(self.floor, evicted_round + 1)

    def __len__(self) -> int:
        return len(self._nonces)

    def state(self) -> dict[str, Any]:
        """JSON-able state, so a server can persist it with its round state."""
        return {"floor": self.floor, "nonces": [[n.hex(), r] for n, r in self._nonces.items()]}

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Restore `state()`; ValueError on malformed input."""
        try:
            floor = int(state["floor"])
            nonces = OrderedDict((bytes.fromhex(n), int(r)) for n, r in state["nonces"])
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"bad replay-guard state: {err}") from None
        self.floor, self._nonces = floor, nonces


# ----------------------------------------------------------------------------- fed-ros keys

def _generate(args: argparse.Namespace) -> int:
    out = Path(args.out)
    names = list(args.names)
    if args.num_robots:
        names += [f"robot_{i}" for i in range(args.num_robots)]
    if args.server:
        names.append("server")
    if not names:
        print("fed-ros keys generate: give robot names, --num-robots N or --server", file=sys.stderr)
        return 2
    allow_path = Path(args.allow_list) if args.allow_list else out / "allow_list.yaml"
    allow = AllowList.from_yaml(allow_path) if allow_path.exists() else AllowList()
    for name in names:
        _id_bytes(name)
        key_path = out / f"{name}.key"
        if key_path.exists() and not args.force:
            signer = Signer.from_file(key_path)
            status = "kept"
        else:
            signer = Signer.generate()
            signer.save(key_path)
            status = "created"
        if name == "server":
            allow.server = signer.public_key
        else:
            allow.add(name, signer.public_key)
        print(f"{status:8s} {key_path}  public {signer.public_key.hex()}")
    allow.to_yaml(allow_path)
    print(f"allow-list {allow_path}: {len(allow)} robots" + (", server key" if allow.server else ""))
    return 0


def _allow(args: argparse.Namespace) -> int:
    path = Path(args.allow_list)
    allow = AllowList.from_yaml(path) if path.exists() else AllowList()
    key = load_public_key(args.key)
    if args.name == "server":
        allow.server = key
    else:
        allow.add(args.name, key)
    allow.to_yaml(path)
    print(f"allowed {args.name} ({key.hex()}) in {path}")
    return 0


def _revoke(args: argparse.Namespace) -> int:
    path = Path(args.allow_list)
    allow = AllowList.from_yaml(path)
    allow.remove(args.name)
    allow.to_yaml(path)
    print(f"revoked {args.name} in {path}")
    return 0


def _list(args: argparse.Namespace) -> int:
    allow = AllowList.from_yaml(args.allow_list)
    if allow.server is not None:
        print(f"server     {allow.server.hex()}")
    for rid in allow.robot_ids:
        print(f"{rid:10s} {allow.public_key(rid).hex()}")
    return 0


def keys_main(argv: Sequence[str] | None = None) -> int:
    """`fed-ros keys`: create key pairs (0600 private keys) and manage the allow-list YAML."""
    parser = argparse.ArgumentParser(prog="fed-ros keys", description=keys_main.__doc__)
    sub = parser.add_subparsers(dest="action", required=True)
    gen = sub.add_parser("generate", help="create key pairs and add them to an allow-list")
    gen.add_argument("names", nargs="*", help="robot ids (e.g. robot_0 robot_1)")
    gen.add_argument("--num-robots", type=int, default=0, help="also create robot_0..robot_{N-1}")
    gen.add_argument("--server", action="store_true", help="also create the server key pair")
    gen.add_argument("--out", default="keys", help="directory for <name>.key / <name>.pub (default: keys)")
    gen.add_argument("--allow-list", default=None, help="allow-list YAML (default: <out>/allow_list.yaml)")
    gen.add_argument("--force", action="store_true", help="replace existing key files")
    gen.set_defaults(func=_generate)
    allow = sub.add_parser("allow", help="add a public key (hex or .pub file) to an allow-list")
    allow.add_argument("name")
    allow.add_argument("key", help="64 hex chars or a .pub file")
    allow.add_argument("--allow-list", required=True)
    allow.set_defaults(func=_allow)
    revoke = sub.add_parser("revoke", help="remove a robot from an allow-list")
    revoke.add_argument("name")
    revoke.add_argument("--allow-list", required=True)
    revoke.set_defaults(func=_revoke)
    lst = sub.add_parser("list", help="print an allow-list")
    lst.add_argument("--allow-list", required=True)
    lst.set_defaults(func=_list)
    args = parser.parse_args(list(argv) if argv is not None else None)
    try:
        return args.func(args)
    except ValueError as err:
        print(f"fed-ros keys: {err}", file=sys.stderr)
        return 1

