"""`fed-ros keys`: the command line over :mod:`fed_ros.core.security.key_admin`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from fed_ros.core.security.key_admin import allow_key, generate_keys, list_keys, revoke_key


def _generate(args: argparse.Namespace) -> int:
    return generate_keys(
        args.out, args.names, args.num_robots, args.server, args.allow_list, args.force
    )


def _allow(args: argparse.Namespace) -> int:
    return allow_key(args.allow_list, args.name, args.key)


def _revoke(args: argparse.Namespace) -> int:
    return revoke_key(args.allow_list, args.name)


def _list(args: argparse.Namespace) -> int:
    return list_keys(args.allow_list)


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
        return int(args.func(args))
    except ValueError as err:
        print(f"fed-ros keys: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(keys_main())
