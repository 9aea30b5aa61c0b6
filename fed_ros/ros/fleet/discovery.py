"""How a fleet's DDS participants find each other: simple discovery, or a Fast DDS Discovery Server.

Simple discovery (the DDS default) multicasts every participant's announcement to every other
one: its traffic grows with the square of the participants, and it needs multicast, which many
networks (Wi-Fi, clouds, VPNs) drop. A Fast DDS Discovery Server is one participant every other
one reaches by unicast; each node finds it through ``ROS_DISCOVERY_SERVER=host:port``
(docs/fleet.md, "Discovery at fleet scale"). The fleet file's ``discovery:`` mapping picks one:

    discovery: {server: start, address: 10.0.0.1, port: 11811}   # started with the fleet server
    discovery: {server: "10.0.0.1:11811"}                          # an existing server

Pure Python like the plan (launch files import it where rclpy may be missing).
"""

from __future__ import annotations

import ipaddress
import socket
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DISCOVERY_SERVER_ENV = "ROS_DISCOVERY_SERVER"
DEFAULT_PORT = 11811  # the port Fast DDS and its CLI use by default
SERVER_EXECUTABLE = "fast-discovery-server"
# The ros-fastdds wheel ships the server binary, and `fastdds discovery` (its Python wrapper,
# which needs psutil and runs whatever `python3` is first on PATH) only forwards to it with this
# command index ("42" = run a server, tools/fastdds/discovery/parser.py); calling the binary
# with it is what that wrapper does, minus the wrapper's dependencies.
SERVER_COMMAND_INDEX = "42"
MODES = ("simple", "start", "external")
_KEYS = {"server", "address", "port"}


@dataclass(frozen=True)
class DiscoveryConfig:
    """Simple discovery, or a Discovery Server the fleet starts (``start``) or points at."""

    mode: str = "simple"
    # start: the address the server listens on and every node reaches (127.0.0.1: one machine);
    # external: the existing server's host.
    address: str = "127.0.0.1"
    port: int = DEFAULT_PORT

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"discovery mode must be one of {MODES}, got {self.mode!r}")
        if isinstance(self.port, bool) or not isinstance(self.port, int):
            raise ValueError(f"discovery 'port' must be an integer, got {self.port!r}")
        if not 1 <= self.port <= 65535:
            raise ValueError(f"discovery 'port' must be in [1, 65535], got {self.port}")
        if self.mode == "start":
            # fast-discovery-server binds this address: it must be an IP of the server's host.
            try:
                ipaddress.IPv4Address(self.address)
            except ValueError:
                raise ValueError(
                    f"discovery 'address' must be an IPv4 address the server host owns, "
                    f"got {self.address!r}"
                ) from None
        elif self.mode == "external" and not self.address.strip():
            raise ValueError("discovery 'server' must name a host, got an empty one")

    @property
    def uses_server(self) -> bool:
        """Whether the fleet's nodes find each other through a Discovery Server."""
        return self.mode != "simple"

    @property
    def endpoint(self) -> str:
        """``host:port`` every node's ROS_DISCOVERY_SERVER names ('' for simple discovery)."""
        return f"{self.address}:{self.port}" if self.uses_server else ""

    def environment(self) -> dict[str, str]:
        """Variables every fleet process gets: ROS_DISCOVERY_SERVER when a server is used."""
        return {DISCOVERY_SERVER_ENV: self.endpoint} if self.uses_server else {}

    def server_arguments(self) -> list[str]:
        """Arguments of the server executable that serves this fleet (``start`` only)."""
        if self.mode != "start":
            raise ValueError(f"discovery mode {self.mode!r} starts no server")
        return [SERVER_COMMAND_INDEX, "-l", self.address, "-p", str(self.port)]


def discovery_from_dict(data: Any) -> DiscoveryConfig:
    """Read a fleet file's ``discovery:`` mapping (absent or empty: simple discovery)."""
    if data is None or data == {}:
        return DiscoveryConfig()
    if not isinstance(data, dict):
        raise ValueError(f"fleet config: 'discovery' must be a mapping, got {data!r}")
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise ValueError(f"fleet discovery: unknown key(s) {unknown} (known: {sorted(_KEYS)})")
    server = data.get("server", "simple")
    if not isinstance(server, str) or not server.strip():
        raise ValueError(
            f"fleet discovery 'server' must be 'start', 'simple' or 'host:port', got {server!r}"
        )
    port = data.get("port", DEFAULT_PORT)
    if server in ("simple", "start"):
        if server == "simple" and ("address" in data or "port" in data):
            raise ValueError("fleet discovery: 'address' and 'port' need 'server: start'")
        return DiscoveryConfig(server, str(data.get("address", "127.0.0.1")), port)
    if "address" in data:
        raise ValueError(
            f"fleet discovery: 'address' is for 'server: start'; an existing server is named "
            f"by 'server' alone, got address {data['address']!r}"
        )
    host, sep, port_text = server.rpartition(":")
    if sep:
        if not port_text.isdigit():
            raise ValueError(f"fleet discovery 'server' must be 'host:port', got {server!r}")
        if "port" in data:
            raise ValueError("fleet discovery: give the port in 'server' or 'port', not both")
        port = int(port_text)
    else:
        host = server
    if not host or any(c.isspace() or c in ";,/" for c in host):
        raise ValueError(f"fleet discovery 'server' must be 'host:port', got {server!r}")
    return DiscoveryConfig("external", host, port)


def find_executable(name: str = SERVER_EXECUTABLE) -> str:
    """An executable beside this Python (the wheels' bin/, where fast-discovery-server is), else on
    PATH (a ROS 2 install)."""
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        raise ValueError(
            f"discovery server: {name!r} not found beside {sys.executable} or on PATH "
            "(the ros-fastdds wheel ships it; so does Fast DDS in a ROS 2 install)"
        )
    return found


def check_listen_address(address: str) -> None:
    """Raise ValueError unless ``address`` is one of this host's: fast-discovery-server given
    another one says it runs there and is reached by nobody (measured: 10.9.9.9 on loopback)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind((address, 0))
        except OSError as exc:
            raise ValueError(
                f"discovery 'address' {address!r} is not an address of this host "
                f"({exc.strerror}): start the fleet's server where it is, or name that host's"
            ) from None
