"""The fleet a protocol-attack run attacks: a real server process and scripted honest robots.

`protocol_attacks` measures, round by round, what attacks do to a signed fleet; this module is
the fleet itself and the means to attack it: the server node as its own process (its log and
audit log on disk), two scripted honest signed robots in the bench's process that answer a round
only when told to, the attacker process (`fed_ros.ros.rigs.attacker`, the one the hostile-peer
suite runs) and the foreign-chunk attack, which has to interleave with an honest upload.
Starting, driving and stopping these processes is one concern; reading a round's outcome from
what they leave behind is the other, which stays in `protocol_attacks`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from fed_ros.core.checks.audit_log import read_audit_log

ATTACKER = [sys.executable, "-m", "fed_ros.ros.rigs.attacker"]


class AttackedFleet:
    """The server process, the scripted honest robots and what they leave on disk."""

    def __init__(self, out: Path, env: dict[str, str], rounds: int, signed: bool) -> None:
        from fed_ros.ros.rigs.scripted import ScriptedRobots, make_keys, server_argv

        self.out, self.env = out, env
        self.log_path = out / "server.log"
        self.audit = [out / "state" / "audit.jsonl.1", out / "state" / "audit.jsonl"]
        self.signers = make_keys(out)
        self.server = subprocess.Popen(
            server_argv(out, rounds=rounds, signed=signed),
            env=env,
            stdout=open(self.log_path, "wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.robots = ScriptedRobots(self.signers, hold=False)
        self.robots.answer_through = -1  # every round waits until its attack is done

    def alive(self) -> bool:
        return self.server.poll() is None

    def wait(self, predicate, timeout: float, what: str, probe: bool = False) -> None:
        from fed_ros.ros.rigs.scripted import wait_for

        poll = (
            (lambda: (self.robots.publish_probe(), self.robots.spin(0.3)))
            if probe
            else self.robots.spin
        )
        wait_for(predicate, timeout, what, poll=poll, alive=self.alive)

    def sizes(self) -> int:
        return sum(p.stat().st_size for p in (self.log_path, *self.audit) if p.exists())

    def entries_since(self, t0: float) -> list[dict]:
        return [
            e for p in self.audit if p.exists() for e in read_audit_log(p) if e.get("time", 0) >= t0
        ]

    def settle(self, quiet_s: float = 2.0, timeout: float = 180.0) -> None:
        """Wait until the server's logs stopped growing for `quiet_s` (it drained its inbox)."""
        end, last, since = time.monotonic() + timeout, -1, time.monotonic()
        while time.monotonic() - since < quiet_s and time.monotonic() < end:
            assert self.alive(), "the server died"
            now = self.sizes()
            if now != last:
                last, since = now, time.monotonic()
            self.robots.spin(0.2)

    def attacker(self, *specs: str, round_idx: int = 0, timeout: float = 600.0) -> dict[str, dict]:
        out = subprocess.run(
            [*ATTACKER, str(self.out / "keys"), "--round", str(round_idx), *specs],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if out.returncode != 0:
            raise RuntimeError(f"attacker {specs} failed: {out.stderr[-2000:]}")
        return {r["attack"]: r for r in map(json.loads, out.stdout.splitlines())}

    def close(self) -> None:
        self.robots.close()
        if self.server.poll() is None:
            os.killpg(self.server.pid, signal.SIGINT)
            try:
                self.server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.server.pid, signal.SIGKILL)
                self.server.wait()


def foreign_chunk_attack(fleet: AttackedFleet, round_idx: int) -> dict:
    """A keyless listener injects a forged chunk 1 right after an honest upload's chunk 0."""
    keys = fleet.out / "keys"
    for name in ("foreign_chunk.ready", "foreign_chunk.heard"):
        (keys / name).unlink(missing_ok=True)
    injector = subprocess.Popen(
        [*ATTACKER, str(keys), "foreign_chunk:1"],
        env=fleet.env,
        stdout=subprocess.PIPE,
        stderr=open(fleet.out / "injector.log", "w"),
        text=True,
    )
    try:
        fleet.wait(
            lambda: (keys / "foreign_chunk.ready").exists() or injector.poll() is not None,
            90,
            "the chunk injector",
        )
        # Handshake: probes until the injector heard our writer (graph counts prove nothing).
        fleet.wait(
            lambda: (keys / "foreign_chunk.heard").exists() or injector.poll() is not None,
            90,
            "the injector to hear the robots",
            probe=True,
        )

        def dropped(pid: str) -> bool:
            return any(
                e["code"] == "foreign_chunk" and e.get("payload_id") == pid
                for p in fleet.audit
                if p.exists()
                for e in read_audit_log(p)
            )

        from fed_ros.ros.rigs.scripted import wait_for

        fleet.robots.between_chunks = (
            lambda pid, chunks: (  # inside the robots' spin: wait without spinning
                setattr(fleet.robots, "between_chunks", None),  # the first upload only
                wait_for(
                    lambda: dropped(pid),
                    60,
                    f"the forged chunk of {pid} to be dropped",
                    alive=fleet.alive,
                ),
            )
        )
        fleet.robots.answer_through = (
            round_idx  # the honest robots answer while the injector listens
        )
        fleet.wait(lambda: injector.poll() is not None, 180, "the chunk injector to finish")
        out, _ = injector.communicate(timeout=60)
        return json.loads(out.splitlines()[-1])
    finally:
        fleet.robots.between_chunks = None
        if injector.poll() is None:
            injector.kill()
            injector.wait()
