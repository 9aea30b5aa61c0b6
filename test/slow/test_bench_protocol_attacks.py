"""`fed-ros bench robustness --protocol --quick` (issue 13): the protocol-attack table of a real
signed fleet (server node process, 2 scripted signed robots, separate attacker processes).
Every attack is refused with its reason, every honest round commits the attack-free reference
models bit for bit, and the server's memory and logs stay bounded."""

from __future__ import annotations

import pytest

from fed_ros.bench import protocol_attacks as P

EXPECTED = {  # attack -> (audit code or log refusal, text in the first reason)
    "register_replay": ("register", "replay"),
    "register_flood": ("register", "not on the allow-list"),
    "register_wrong_key": ("register", "does not match the allow-list"),
    "register_no_proof": ("register", "not signed"),
    "forged_update": ("bad_signature", "bad signature"),
    "unsigned_update": ("unsigned", "not signed"),
    "resend_flood": ("model_resend refused", "no key to check it"),
    "junk_burst": ("oversize", ""),
    "foreign_chunk": ("foreign_chunk", "sha256"),
}


def test_resend_refusals_are_counted_from_the_round_line_not_the_throttled_one():
    log = (
        "[WARN] model resend request refused (20 so far): not signed\n"
        "[WARN] model resend over the rate limit (242 refused)\n"  # throttled: the last one of 5 s
        "[INFO] round 3: committed (2/2 updates; model resend 300 refused)\n"
    )
    assert P._resend_refused_count(log) == 300
    assert P._resend_refused_count(log.rsplit("\n", 2)[0]) == 242
    assert (
        P._resend_refused_count("[INFO] round 0: committed (2/2 updates; model resend 0 refused)")
        == 0
    )


@pytest.mark.ros
@pytest.mark.timeout(600)
def test_quick_protocol_table_every_attack_refused_rounds_complete_bit_identical(tmp_path, ros_env):
    rows, facts = P.run_protocol(tmp_path, P.QUICK_ATTACKS, env=ros_env)
    print("\n" + P.format_protocol_table(rows))
    assert [r.attack for r in rows] == ["none", *(a.partition(":")[0] for a in P.QUICK_ATTACKS)]
    assert facts["handler_failures"] == 0 and facts["logger_severity_errors"] == 0, facts
    for r in rows:
        assert r.round_completed and r.models_identical, r
        # Bounded (issue 13 goal: <= 50 MB RSS and <= 10 MB logs even for 10,000 junk messages).
        assert r.rss_growth_mb <= 50.0 and r.log_growth_mb <= 10.0, r
        if r.attack == "none":
            assert r.rejected is None and r.codes == [] and r.refused == 0, r
            continue
        code, text = EXPECTED[r.attack]
        assert r.rejected is True and r.refused >= 1, r
        assert code in r.codes and text in r.reason, r
    by = {r.attack: r for r in rows}
    assert by["register_flood"].refused == by["register_flood"].sent == 50
    # Every unsigned model_resend request is refused and counted: by its signature or, past the
    # rate limit, unread. Exactly: the round's outcome line carries the server's running count
    # (the rate-limit line is throttled to one per 5 s and trailed by up to 58 of 300 under load).
    assert by["resend_flood"].refused == by["resend_flood"].sent == 300, by["resend_flood"]
    assert by["forged_update"].detail["payload_ids"] and by["foreign_chunk"].sent == 1
