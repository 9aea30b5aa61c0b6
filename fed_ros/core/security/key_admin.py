"""The ``fed-ros keys`` command: create key pairs and manage an allow-list YAML from a shell.

A command-line front end over :mod:`fed_ros.core.security.auth` (``Signer``, ``AllowList``)
and :mod:`fed_ros.core.security.keys` (``load_public_key``). It stands alone because it is an
operator's tool, not part of what robots and the server run: argument parsing and printing
stay out of the signing code.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from fed_ros.core.security.auth import AllowList, Signer
from fed_ros.core.security.keys import load_public_key
from fed_ros.core.security.signed_messages import robot_id_bytes


def _generate(args: argparse.Namespace) -> int:
    out = Path(args.out)
    names = list(args.names)
    if args.num_robots:
        names += [f"robot_{i}" for i in range(args.num_robots)]
    if args.server:
        names.append("server")
    if not names:
        print(
            "fed-ros keys generate: give robot names, --num-robots N or --server", file=sys.stderr
        )
        return 2
    allow_path = Path(args.allow_list) if args.allow_list else out / "allow_list.yaml"
    allow = AllowList.from_yaml(allow_path) if allow_path.exists() else AllowList()
    for name in names:
        robot_id_bytes(name)
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
    print(
        f"allow-list {allow_path}: {len(allow)} robots" + (", server key" if allow.server else "")
    )
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
    gen.add_argument(
        "--out", default="keys", help="directory for <name>.key / <name>.pub (default: keys)"
    )
    gen.add_argument(
        "--allow-list", default=None, help="allow-list YAML (default: <out>/allow_list.yaml)"
    )
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
