"""Ed25519 keys of the fleet: their raw encoding and their files on disk.

A public key travels as 32 raw bytes (``Register.public_key``) or 64 hex characters (the
allow-list YAML, ``<name>.pub``); a private key lives in a PKCS#8 PEM file written with mode
0600 and refused on load when group/other can read it, as ssh does. These are what a key IS
and where it is kept; what is signed with it and who is trusted (``Signer``, ``AllowList``,
``verify_signature``) is :mod:`fed_ros.core.security.auth`, which builds on this module.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

PUBLIC_KEY_BYTES = 32


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


# ----------------------------------------------------------------------------- files


def save_private_key(key: Ed25519PrivateKey, path: str | Path) -> Path:
    """Write `key` as PEM with mode 0600 atomically, plus the hex public key next to it (`.pub`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
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
    """Load an Ed25519 PEM private key; ValueError naming the path if missing, group/other-readable,
    unloadable (not PEM, passphrase-encrypted) or not Ed25519."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"private key file not found: {str(path)!r}")
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise ValueError(
            f"private key {str(path)!r} has mode {mode:04o}; it must not be readable by "
            f"group/others (chmod 600 {path})"
        )
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (
        TypeError,
        ValueError,
        UnsupportedAlgorithm,
    ) as err:  # encrypted (TypeError), not PEM, unknown
        raise ValueError(f"private key {str(path)!r} cannot be loaded: {err}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"private key {str(path)!r} is {type(key).__name__}, not Ed25519")
    return key


def load_public_key(path_or_hex: str | Path) -> bytes:
    """Raw public key from a `.pub` hex file or a hex string."""
    text = str(path_or_hex)
    if Path(text).is_file():
        text = Path(text).read_text().strip()
    return raw_public_key(public_key_from_bytes(text))
