"""`fed-ros bench robustness --protocol`: protocol attacks against a real signed fleet (issue 13).

A real server node (its own process; allow-list, `require_signatures`, server key, fedavg, ROS
chunks) and two honest signed robots (scripted, in this process: deterministic updates, so every
round's cluster model has a reference computed without DDS and without an attacker). Round 0 is
clean; every later round first runs one attack from a separate attacker process
(`fed_ros.ros.rigs.attacker`, the same one the hostile-peer suite uses) while the robots hold
their answers, then lets the honest robots answer. One row per round:

* rejected?: nothing the attacker sent was accepted (no Register accepted, no audited accept of a
  payload the honest robots did not send) and the server logged or audited a refusal;
* reason code(s): the audit codes of that round's refusals (resend requests: server log lines);
* round completed: the honest round committed; identical: its committed cluster models are
  bit-identical to the attack-free reference of the same round;
* RSS / log growth: server RSS and server log + audit log sizes from the round's announcement
  (before the attack) to its commit.

Nothing here is a stated number: every cell is measured on the run that prints it. The fleet
under attack and the attacker process are `protocol_fleet`'s.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fed_ros.bench.protocol_fleet import AttackedFleet, foreign_chunk_attack
from fed_ros.core.rounds.store import ModelStore
from fed_ros.ros.rigs.domains import exclusive_domain_id

QUICK_ATTACKS = (
    "register_replay",
    "register_flood:50",
    "register_wrong_key",
    "register_no_proof",
    "forged_update:1",
    "unsigned_update:1",
    "resend_flood:300",
    "junk_burst:100",
    "foreign_chunk:1",
)
FULL_ATTACKS = (
    "register_replay",
    "register_flood:200",
    "register_wrong_key",
    "register_no_proof",
    "forged_update:1",
    "unsigned_update:1",
    "resend_flood:1000",
    "junk_burst:2000",
    "foreign_chunk:1",
)


@dataclass
class ProtocolRow:
    """One round of the protocol-attack table (attack "none": the clean round 0)."""

    attack: str
    sent: int
    rejected: bool | None  # None: nothing to reject (clean round)
    codes: list[str]
    reason: str  # the first refusal's reason text (service answer, audit entry or server log line)
    refused: int  # refusals seen: Register answers, audit entries and logged resend refusals
    round_completed: bool
    models_identical: bool
    rss_growth_mb: float
    log_growth_mb: float
    seconds: float
    detail: dict = field(default_factory=dict)


# The running count of refused model_resend requests: per refusal while under the rate limit,
# throttled (every 5 s) past it, and exact on each round's outcome line ("model resend N refused").
_RESEND_COUNT = re.compile(
    r"model resend (?:request refused \((\d+) so far\)|over the rate limit \((\d+) refused\)"
    r"|(\d+) refused\))"
)


def _resend_refused_count(log_text: str) -> int:
    """The last running count of refused model_resend requests in a server log (0: none)."""
    counts = [int(a or b or c) for a, b, c in _RESEND_COUNT.findall(log_text)]
    return max(counts, default=0)


@contextlib.contextmanager
def ros_domain(env: dict[str, str]) -> Iterator[dict[str, str]]:
    """`env` as is when it names a ROS_DOMAIN_ID; else one no other fed_ros run holds (flock)."""
    if env.get("ROS_DOMAIN_ID"):
        yield env
        return
    with exclusive_domain_id() as domain:
        yield {**env, "ROS_DOMAIN_ID": str(domain), "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST"}


def _row(fleet: AttackedFleet, spec: str, round_idx: int, reference, rss_mb) -> ProtocolRow:
    from fed_ros.ros.rigs.reference_federation import committed_models

    name, _, count = spec.partition(":")
    fleet.wait(
        lambda: fleet.robots.round == round_idx and fleet.robots.stage == "train",
        240,
        f"round {round_idx} announced",
    )
    t0, wall0, rss0, size0 = time.monotonic(), time.time(), rss_mb(fleet.server.pid), fleet.sizes()
    log0 = fleet.log_path.stat().st_size
    result: dict = {"attack": name, "sent": 0}
    if name == "foreign_chunk":
        result = foreign_chunk_attack(fleet, round_idx)
    elif name != "none":
        result = fleet.attacker(spec, round_idx=round_idx)[name]
    fleet.settle()
    fleet.robots.answer_through = round_idx
    store = fleet.out / "state"
    completed = True
    try:
        fleet.wait(
            lambda: store.is_dir() and round_idx in ModelStore(store).committed_rounds(),
            240,
            f"round {round_idx} committed",
        )
    except AssertionError:
        completed = False
    fleet.settle(quiet_s=1.0)
    identical = completed and committed_models(store) == (round_idx, reference(round_idx + 1))
    rss1, size1 = rss_mb(fleet.server.pid), fleet.sizes()
    honest = set(fleet.robots.sent)
    window = [e for e in fleet.entries_since(wall0) if e.get("payload_id") != "probe"]
    foreign_ok = [
        e
        for e in window
        if e["accepted"] and e["kind"] == "update" and e.get("payload_id") not in honest
    ]
    refused = [
        e
        for e in window
        if not e["accepted"] and (e.get("payload_id") not in honest or e["code"] == "foreign_chunk")
    ]
    codes = sorted({e["code"] for e in refused})
    whole_log = fleet.log_path.read_bytes()
    log_text = whole_log[log0:].decode("utf-8", "replace")
    resend_lines = [ln for ln in log_text.splitlines() if "model resend request refused" in ln]
    # The server's running count of refused model_resend requests (signature and rate limit;
    # the rate-limit line is throttled, so the count comes from the numbers, not the lines).
    resend_refusals = max(
        len(resend_lines),
        _resend_refused_count(log_text)
        - _resend_refused_count(whole_log[:log0].decode("utf-8", "replace")),
    )
    if resend_refusals:
        codes.append("model_resend refused")
    reasons = [
        *result.get("reasons", []),
        *(e.get("reason", "") for e in refused),
        *(ln.partition("so far): ")[2] for ln in resend_lines),
    ]
    accepted = int(result.get("accepted", 0)) + len(foreign_ok)
    rejected = None if name == "none" else (accepted == 0 and bool(codes or result.get("reasons")))
    detail = {
        k: v
        for k, v in result.items()
        if k in ("answered", "accepted", "reasons", "payload_ids", "acked")
    }
    n_refused = (
        (int(result["answered"]) - int(result["accepted"]))
        if "answered" in result
        else (len(refused) + resend_refusals)
    )  # Register refusals are answered and audited: count them once
    return ProtocolRow(
        name,
        int(result.get("sent", 0)),
        rejected,
        codes,
        (reasons or [""])[0][:90],
        n_refused,
        completed,
        identical,
        round(rss1 - rss0, 1),
        round((size1 - size0) / 1e6, 3),
        round(time.monotonic() - t0, 1),
        detail,
    )


def run_protocol(
    out: Path,
    attacks: Sequence[str] = QUICK_ATTACKS,
    env: dict[str, str] | None = None,
    signed: bool = True,
) -> tuple[list[ProtocolRow], dict]:
    """Run the fleet, one attack per round after a clean round 0; (rows, run facts)."""
    from fed_ros.ros.rigs.reference_federation import reference_models
    from fed_ros.ros.rigs.scripted import ROBOTS, initial_model, rss_mb
    from fed_ros.ros.wire.register import register_request

    out.mkdir(parents=True, exist_ok=True)
    specs = ["none", *attacks]
    with ros_domain(dict(os.environ if env is None else env)) as ros_env:
        saved = {k: os.environ.get(k) for k in ("ROS_DOMAIN_ID", "ROS_AUTOMATIC_DISCOVERY_RANGE")}
        os.environ.update(
            {k: ros_env[k] for k in saved if k in ros_env}
        )  # the in-process robots join it
        fleet = AttackedFleet(out, ros_env, rounds=len(specs), signed=signed)
        initial = initial_model()
        refs: dict[int, dict] = {}

        def reference(rounds: int) -> dict:
            if rounds not in refs:
                refs[rounds] = reference_models(initial, ROBOTS, rounds)
            return refs[rounds]

        try:
            robots = fleet.robots
            assert robots.client.wait_for_service(timeout_sec=120.0), (
                "the server never offered /fleet/register"
            )
            assert robots.call(
                lambda: register_request(
                    "robot_0", tasks=["lift"], num_samples=100, signer=fleet.signers["robot_0"]
                )
            ).accepted
            honest = (
                robots.last_request
            )  # signed afresh per try: the one answered is what an eavesdropper records
            (out / "keys" / "captured_register.json").write_text(
                json.dumps(
                    {  # what an eavesdropper records
                        "robot_id": honest.robot_id,
                        "tasks": list(honest.tasks),
                        "action_dim": honest.action_dim,
                        "num_samples": honest.num_samples,
                        "timestamp_ns": honest.timestamp_ns,
                        **{
                            k: bytes(getattr(honest, k)).hex()
                            for k in ("public_key", "nonce", "signature")
                        },
                    }
                )
            )
            robots.register_all()
            rows = [_row(fleet, spec, i, reference, rss_mb) for i, spec in enumerate(specs)]
        finally:
            fleet.close()
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    log = fleet.log_path.read_text(errors="replace")
    facts = {
        "server_exit": fleet.server.returncode,
        "handler_failures": log.count("failed ("),
        "logger_severity_errors": log.count("Logger severity"),
        "out": str(out),
    }
    return rows, facts


def format_protocol_table(rows: Sequence[ProtocolRow]) -> str:
    head = [
        "attack",
        "sent",
        "refused",
        "rejected?",
        "reason code(s)",
        "first reason",
        "honest round completed",
        "models identical",
        "server RSS growth (MiB)",
        "log growth (MB)",
        "s",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    yn = {True: "yes", False: "NO", None: "-"}
    for r in rows:
        lines.append(
            "| "
            + " | ".join(
                [
                    r.attack,
                    str(r.sent),
                    str(r.refused),
                    yn[r.rejected],
                    ", ".join(r.codes) or "-",
                    r.reason.replace("|", "/") or "-",
                    yn[r.round_completed],
                    yn[r.models_identical],
                    f"{r.rss_growth_mb:+.1f}",
                    f"{r.log_growth_mb:+.3f}",
                    f"{r.seconds:.0f}",
                ]
            )
            + " |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="fed-ros bench robustness --protocol", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--quick", action="store_true", help="smaller floods (a few minutes on 2 cores)"
    )
    parser.add_argument(
        "--out", default=None, help="run directory (keys, state, logs); default: a temp dir"
    )
    parser.add_argument("--json", default=None, help="also write the rows as JSON here")
    parser.add_argument(
        "--unsigned",
        action="store_true",
        help="server without allow-list or signatures: what the same attacks do then",
    )
    args = parser.parse_args(list(argv) if argv is not None else None)
    out = Path(args.out or tempfile.mkdtemp(prefix="fed_ros_protocol_"))
    t0 = time.perf_counter()
    rows, facts = run_protocol(
        out, QUICK_ATTACKS if args.quick else FULL_ATTACKS, signed=not args.unsigned
    )
    print(
        f"{'Unsigned' if args.unsigned else 'Signed'} fleet "
        "(server node + 2 scripted signed robots, fedavg); "
        f"round 0 clean, then one attack per round from a separate attacker process.\n"
    )
    print(format_protocol_table(rows))
    print(
        f"\n({time.perf_counter() - t0:.0f} s; server handler failures "
        f"{facts['handler_failures']}, "
        f"'Logger severity' errors {facts['logger_severity_errors']}; run directory {out})"
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"rows": [asdict(r) for r in rows], "facts": facts}, indent=1)
        )
    bad = [
        r.attack
        for r in rows
        if r.rejected is False or not r.round_completed or not r.models_identical
    ]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
