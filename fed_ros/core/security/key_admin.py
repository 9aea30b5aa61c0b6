"""Key pairs and allow-list YAML files, as an operator manages them (``fed-ros keys``).

An operator's tool over :mod:`fed_ros.core.security.auth` (``Signer``, ``AllowList``) and
:mod:`fed_ros.core.security.keys` (``load_public_key``), not part of what robots and the server
run. Each action prints what it did and returns an exit code; the command line that calls them
is :mod:`fed_ros.commands.keys` (argument parsing stays in the CLI layer).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from fed_ros.core.security.auth import AllowList, Signer
from fed_ros.core.security.keys import load_public_key
from fed_ros.core.security.signed_messages import robot_id_bytes


def generate_keys(
    out: str | Path,
    names: Sequence[str] = (),
    num_robots: int = 0,
    server: bool = False,
    allow_list: str | Path | None = None,
    force: bool = False,
) -> int:
    """Create (or keep) ``<out>/<name>.key``/``.pub`` pairs and add them to an allow-list."""
    out = Path(out)
    names = list(names)
    if num_robots:
        names += [f"robot_{i}" for i in range(num_robots)]
    if server:
        names.append("server")
    if not names:
        print(
            "fed-ros keys generate: give robot names, --num-robots N or --server", file=sys.stderr
        )
        return 2
    allow_path = Path(allow_list) if allow_list else out / "allow_list.yaml"
    allow = AllowList.from_yaml(allow_path) if allow_path.exists() else AllowList()
    for name in names:
        robot_id_bytes(name)
        key_path = out / f"{name}.key"
        if key_path.exists() and not force:
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
    print(
        f"allow-list {allow_path}: {len(allow)} robots" + (", server key" if allow.server else "")
    )
    return 0


def allow_key(allow_list: str | Path, name: str, key: str) -> int:
    """Add ``name``'s public key (64 hex chars or a .pub file) to an allow-list."""
    path = Path(allow_list)
    allow = AllowList.from_yaml(path) if path.exists() else AllowList()
    public_key = load_public_key(key)
    if name == "server":
        allow.server = public_key
    else:
        allow.add(name, public_key)
    allow.to_yaml(path)
    print(f"allowed {name} ({public_key.hex()}) in {path}")
    return 0


def revoke_key(allow_list: str | Path, name: str) -> int:
    """Remove a robot from an allow-list."""
    path = Path(allow_list)
    allow = AllowList.from_yaml(path)
    allow.remove(name)
    allow.to_yaml(path)
    print(f"revoked {name} in {path}")
    return 0


def list_keys(allow_list: str | Path) -> int:
    """Print an allow-list: the server key, then one line per robot."""
    allow = AllowList.from_yaml(allow_list)
    if allow.server is not None:
        print(f"server     {allow.server.hex()}")
    for rid in allow.robot_ids:
        key = allow.public_key(rid)
        assert key is not None  # robot_ids lists the robots that have a key
        print(f"{rid:10s} {key.hex()}")
    return 0
