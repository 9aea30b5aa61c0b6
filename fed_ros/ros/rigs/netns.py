"""Separate hosts on one Linux machine: network namespaces on a bridge, tbf-shaped links, outages.

Used by the separate-host fleet test (test/slow/test_multihost.py) and `fed-ros bench transfer
--shaped`. Each host is a network namespace with its own address on a bridge that lives in a
"hub" namespace, and its processes run with their own hostname, /dev/shm and machine-id, so
Fast DDS sees different machines and really uses the network (with a shared /dev/shm it
talks shared memory and the network is never exercised; ../shared/multihost.md).

Nothing is created in the caller's network namespace: every veth is made inside a host
namespace with its peer moved straight into the hub. ``close()`` kills the processes left in
the namespaces it created, deletes them (which deletes their veths and the bridge) and
removes its temporary files. Needs root and iproute2 (``ip netns``, ``tc``); see
:func:`unavailable_reason`.
"""

from __future__ import annotations

import os
import random
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

# Multicast route every host needs: no default route exists in a namespace, and SPDP
# discovery uses multicast 239.255.0.1.
MULTICAST_ROUTE = "224.0.0.0/4"
IFACE = "eth0"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def _tc(*args: str) -> None:
    subprocess.run(["tc", *args], check=True, capture_output=True, text=True)


def unavailable_reason() -> str:
    """Why separate hosts cannot be made here ('' when they can): not root, or no iproute2 netns."""
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs as root)"
    for tool in ("ip", "tc", "unshare"):
        if shutil.which(tool) is None:
            return f"{tool!r} is not installed (iproute2 / util-linux)"
    probe = f"fedros-probe-{secrets.token_hex(4)}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"'ip netns add' failed: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return ""


@dataclass(frozen=True)
class Host:
    """One simulated machine: namespace, hostname, address on the bridge, link rate."""

    name: str  # the caller's name for it (e.g. "server", "robot_0")
    netns: str  # network namespace (unique per Network)
    hostname: str
    address: str  # IPv4 on eth0
    machine_id_file: Path
    rate_mbit: float | None  # tbf rate of its link in both directions; None = unshaped
    hub_port: str  # its veth peer inside the hub namespace


class Network:
    """Hosts on one bridge, each in its own namespace; a context manager that always cleans up.

    ``Network(["server", "robot_0"], rates={"robot_0": 20})`` makes a random 10.77.x.0/24
    (namespaces are private, the random third octet only keeps parallel runs' addresses
    apart in logs) and unique namespace names.
    """

    def __init__(
        self,
        names: list[str],
        rates: dict[str, float] | None = None,
        *,
        tbf_burst: str = "32kbit",
        tbf_latency: str = "400ms",
        tag: str | None = None,
    ) -> None:
        if not names or len(set(names)) != len(names):
            raise ValueError(f"host names must be unique and non-empty, got {names}")
        if len(names) > 250:
            raise ValueError("at most 250 hosts on one /24")
        rates = dict(rates or {})
        unknown = set(rates) - set(names)
        if unknown:
            raise ValueError(f"rates for unknown hosts {sorted(unknown)}")
        self.tag = tag or secrets.token_hex(3)
        self.subnet = f"10.77.{random.SystemRandom().randrange(256)}"
        self.hub = f"fedros-{self.tag}-hub"
        self.tbf_burst, self.tbf_latency = tbf_burst, tbf_latency
        self._tmp = Path(tempfile.mkdtemp(prefix=f"fedros-netns-{self.tag}-"))
        self.hosts: dict[str, Host] = {}
        for i, name in enumerate(names):
            mid = self._tmp / f"machine-id-{i}"
            mid.write_text(secrets.token_hex(16) + "\n")
            self.hosts[name] = Host(
                name=name,
                netns=f"fedros-{self.tag}-h{i}",
                hostname=f"fedros-{self.tag}-h{i}",
                address=f"{self.subnet}.{i + 1}",
                machine_id_file=mid,
                rate_mbit=rates.get(name),
                hub_port=f"p{i}",
            )
        self._created: list[str] = []
        self._closed = False

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> "Network":
        try:
            self.create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def create(self) -> None:
        """Make the hub with its bridge and every host with its link (raises on any failure)."""
        _ip("netns", "add", self.hub)
        self._created.append(self.hub)
        _ip("-n", self.hub, "link", "set", "lo", "up")
        _ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        # Multicast snooping would filter SPDP multicast on the bridge (no querier here).
        _ip("-n", self.hub, "link", "set", "br0", "type", "bridge", "mcast_snooping", "0")
        _ip("-n", self.hub, "link", "set", "br0", "up")
        for host in self.hosts.values():
            _ip("netns", "add", host.netns)
            self._created.append(host.netns)
            ns = host.netns
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip(
                "-n",
                ns,
                "link",
                "add",
                IFACE,
                "type",
                "veth",
                "peer",
                "name",
                host.hub_port,
                "netns",
                self.hub,
            )
            _ip("-n", ns, "addr", "add", f"{host.address}/24", "dev", IFACE)
            _ip("-n", ns, "link", "set", IFACE, "up")
            _ip("-n", self.hub, "link", "set", host.hub_port, "master", "br0")
            _ip("-n", self.hub, "link", "set", host.hub_port, "up")
            _ip("-n", ns, "route", "add", MULTICAST_ROUTE, "dev", IFACE)
            if host.rate_mbit:
                self.shape(host.name, host.rate_mbit)

    def shape(
        self, name: str, rate_mbit: float, *, burst: str | None = None, latency: str | None = None
    ) -> None:
        """tbf on the host's eth0 (its egress) and on its hub port (its ingress)."""
        host = self.hosts[name]
        spec = [
            "tbf",
            "rate",
            f"{rate_mbit:g}mbit",
            "burst",
            burst or self.tbf_burst,
            "latency",
            latency or self.tbf_latency,
        ]
        for ns, dev in ((host.netns, IFACE), (self.hub, host.hub_port)):
            _tc("-n", ns, "qdisc", "replace", "dev", dev, "root", *spec)

    def block_multicast(self) -> None:
        """Stop the bridge forwarding multicast between hosts, as Wi-Fi and cloud networks do.

        Each hub port stops flooding multicast (``mcast_flood off``; with snooping off the bridge
        forwards no multicast otherwise). Removing the hosts' multicast route is not enough:
        Fast DDS picks the interface itself (IP_MULTICAST_IF) and simple discovery still worked.
        """
        for host in self.hosts.values():
            _ip(
                "-n",
                self.hub,
                "link",
                "set",
                "dev",
                host.hub_port,
                "type",
                "bridge_slave",
                "mcast_flood",
                "off",
            )

    def counters(self, name: str) -> dict[str, tuple[int, int]]:
        """(rx_bytes, tx_bytes) of every interface of a host (its /proc/net/dev)."""
        out = subprocess.run(
            ["ip", "netns", "exec", self.hosts[name].netns, "cat", "/proc/net/dev"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        result = {}
        for line in out.splitlines()[2:]:  # two header lines
            iface, _, fields = line.partition(":")
            values = fields.split()
            result[iface.strip()] = (int(values[0]), int(values[8]))
        return result

    def link_down(self, name: str) -> None:
        """Cut the host's link (its eth0 goes down; the route with it)."""
        _ip("-n", self.hosts[name].netns, "link", "set", IFACE, "down")

    def link_up(self, name: str) -> None:
        """Restore the host's link and its multicast route (dropped when the link went down)."""
        ns = self.hosts[name].netns
        _ip("-n", ns, "link", "set", IFACE, "up")
        _ip("-n", ns, "route", "replace", MULTICAST_ROUTE, "dev", IFACE)

    def command(self, name: str, argv: list[str]) -> list[str]:
        """``argv`` run as a process of host ``name``: its namespace, hostname, /dev/shm,
        machine-id.

        ``ip netns exec`` gives a private mount namespace, so the tmpfs and the bind mount stay
        inside; every step execs, so the returned process is ``argv`` itself (signals reach it).
        """
        host = self.hosts[name]
        script = (
            'hostname "$0" && mount -t tmpfs tmpfs /dev/shm && '
            f'mount --bind "{host.machine_id_file}" /etc/machine-id && exec "$@"'
        )
        return [
            "ip",
            "netns",
            "exec",
            host.netns,
            "unshare",
            "--uts",
            "sh",
            "-c",
            script,
            host.hostname,
            *argv,
        ]

    def pids(self, name: str | None = None) -> list[int]:
        """Processes running in a host's namespace (all hosts when ``name`` is None)."""
        out: list[int] = []
        for ns in [self.hosts[name].netns] if name else [h.netns for h in self.hosts.values()]:
            res = _ip("netns", "pids", ns, check=False)
            out += [int(p) for p in res.stdout.split()]
        return out

    def close(self, grace_s: float = 5.0) -> None:
        """Stop what runs in our namespaces (SIGINT, then SIGKILL), delete them and our temp
        files."""
        if self._closed:
            return
        self._closed = True
        try:
            existing = set(_ip("netns", "list", check=False).stdout.split())
            mine = [ns for ns in self._created if ns in existing]
            for sig, wait in ((signal.SIGINT, grace_s), (signal.SIGKILL, 2.0)):
                pids = [
                    p
                    for ns in mine
                    for p in map(int, _ip("netns", "pids", ns, check=False).stdout.split())
                ]
                for pid in pids:
                    try:
                        os.kill(pid, sig)
                    except ProcessLookupError:
                        pass
                deadline = time.monotonic() + wait
                while pids and time.monotonic() < deadline:
                    pids = [p for p in pids if _alive(p)]
                    time.sleep(0.05)
            for ns in reversed(mine):  # hosts first (their veths go with them), the hub last
                _ip("netns", "del", ns, check=False)
        finally:
            shutil.rmtree(self._tmp, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie child of ours counts as gone (its parent reaps it later).
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
