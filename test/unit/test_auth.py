"""S3 (signed updates), L5 (replayed/late rejected), key files and the `fed-ros keys` command."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import numpy as np
import pytest
import yaml

from fed_ros.core.security import auth
from fed_ros.commands.keys import keys_main
from fed_ros.core.security import keys
from fed_ros.core.security import signed_messages
from fed_ros.core.security.auth import AllowList, Signer
from fed_ros.core.security.replay import ReplayGuard


HDR = dict(base_round=2, num_samples=100, cluster_id=-1)


@pytest.fixture(scope="module")
def robot() -> Signer:
    return Signer.generate()


def test_update_signature_verifies_and_binds_every_field(robot):
    nonce, digest = signed_messages.new_nonce(), signed_messages.sha256_hex(b"payload")
    allow = AllowList({"robot_0": robot.public_key})
    sig = robot.sign_update(3, "robot_0", nonce, digest, **HDR)
    assert allow.verify_update("robot_0", 3, nonce, digest, sig, **HDR) is None
    # Changing any signed field breaks the signature.
    assert "bad signature" in allow.verify_update("robot_0", 4, nonce, digest, sig, **HDR)
    assert "bad signature" in allow.verify_update(
        "robot_0", 3, signed_messages.new_nonce(), digest, sig, **HDR
    )
    assert "bad signature" in allow.verify_update(
        "robot_0", 3, nonce, signed_messages.sha256_hex(b"other"), sig, **HDR
    )
    flipped = bytes([sig[0] ^ 1]) + sig[1:]
    assert "bad signature" in allow.verify_update("robot_0", 3, nonce, digest, flipped, **HDR)
    # The header fields that steer aggregation are signed too (no re-weighting in transit).
    for field, value in (("num_samples", 10**6), ("base_round", 1), ("cluster_id", 0)):
        assert "bad signature" in allow.verify_update(
            "robot_0", 3, nonce, digest, sig, **{**HDR, field: value}
        )


def test_forged_and_unknown_keys_rejected(robot):
    mallory = Signer.generate()
    allow = AllowList({"robot_0": robot.public_key})
    nonce, digest = signed_messages.new_nonce(), signed_messages.sha256_hex(b"x")
    # Mallory signs as robot_0 with her own key: forged.
    forged = mallory.sign_update(1, "robot_0", nonce, digest, **HDR)
    assert "bad signature" in allow.verify_update("robot_0", 1, nonce, digest, forged, **HDR)
    # Mallory as herself: not on the allow-list.
    own = mallory.sign_update(1, "mallory", nonce, digest, **HDR)
    assert "unknown robot 'mallory'" in allow.verify_update("mallory", 1, nonce, digest, own, **HDR)
    assert "not signed" in allow.verify_update("robot_0", 1, nonce, digest, b"", **HDR)


def test_signatures_are_domain_separated(robot):
    """An update signature is not a valid descriptor signature over the same digest."""
    nonce, digest = signed_messages.new_nonce(), signed_messages.sha256_hex(b"x")
    allow = AllowList({"robot_0": robot.public_key})
    sig = robot.sign_update(2, "robot_0", nonce, digest, **HDR)
    assert allow.verify_descriptor("robot_0", 2, nonce, digest, sig) is not None
    assert (
        allow.verify_descriptor(
            "robot_0", 2, nonce, digest, robot.sign_descriptor(2, "robot_0", nonce, digest)
        )
        is None
    )


def test_canonical_message_rejects_bad_fields():
    nonce = signed_messages.new_nonce()
    digest = "ab" * 32
    with pytest.raises(ValueError, match="nonce must be 16 bytes, got 3"):
        signed_messages.update_message(1, "r", b"abc", digest, **HDR)
    with pytest.raises(ValueError, match="round must be in"):
        signed_messages.update_message(-1, "r", nonce, digest, **HDR)
    with pytest.raises(ValueError, match="robot id must be a non-empty string"):
        signed_messages.update_message(1, "", nonce, digest, **HDR)
    with pytest.raises(ValueError, match="payload sha256 is not hex"):
        signed_messages.update_message(1, "r", nonce, "zz" * 32, **HDR)
    with pytest.raises(ValueError, match="32 bytes"):
        signed_messages.update_message(1, "r", nonce, "ab" * 8, **HDR)
    # Id length is encoded: ("ab", round) and ("a", ...) cannot collide.
    assert signed_messages.update_message(
        1, "ab", nonce, digest, **HDR
    ) != signed_messages.update_message(1, "a", nonce, digest, **HDR)


def test_descriptor_digest_is_canonical():
    base = dict(
        kind="gaussian", dims=3, mean=[1.0, 2.0, 3.0], variance=[0.1, 0.2, 0.3], num_samples=10
    )
    d = signed_messages.descriptor_digest(**base)
    # float64 and float32 inputs hash the same (both ends send float32 on the wire).
    assert d == signed_messages.descriptor_digest(
        **{**base, "mean": np.array([1, 2, 3], np.float64)}
    )
    assert d != signed_messages.descriptor_digest(**{**base, "num_samples": 11})
    assert d != signed_messages.descriptor_digest(**{**base, "variance": [0.1, 0.2, 0.4]})
    s1 = signed_messages.descriptor_digest(**base, scores={"a": 1.0, "b": 2.0})
    assert s1 == signed_messages.descriptor_digest(**base, scores={"b": 2.0, "a": 1.0})
    assert s1 != signed_messages.descriptor_digest(**base, scores={"a": 2.0, "b": 1.0})


def test_cluster_model_signature(robot):
    digest = signed_messages.sha256_hex(b"model")
    sig = robot.sign_cluster_model(5, 1, digest)
    assert auth.verify_signature(
        robot.public_key, signed_messages.cluster_model_message(5, 1, digest), sig
    )
    assert not auth.verify_signature(
        robot.public_key, signed_messages.cluster_model_message(5, 0, digest), sig
    )
    assert not auth.verify_signature(
        robot.public_key, signed_messages.cluster_model_message(5, 1, digest), sig[:10]
    )


def test_replay_guard_rejects_reused_nonce_and_old_round():
    guard = ReplayGuard()
    guard.advance(3)
    nonce = signed_messages.new_nonce()
    assert guard.check("r", 3, nonce) is None
    guard.record("r", 3, nonce)
    assert "already used (replay)" in guard.check("r", 3, nonce)
    assert "older than the oldest open round 3" in guard.check("r", 2, signed_messages.new_nonce())
    guard.advance(4)
    # Round-3 nonces are forgotten, but round 3 itself is now refused.
    assert len(guard) == 0
    assert "older than" in guard.check("r", 3, nonce)


def test_replay_guard_memory_is_bounded_and_stays_safe():
    guard = ReplayGuard(max_nonces=100)
    nonces = []
    for i in range(1000):
        n = signed_messages.new_nonce()
        nonces.append((i // 10, n))
        guard.record("r", i // 10, n)
    assert len(guard) == 100
    # Every evicted nonce is either still held or its round is now below the floor.
    for rnd, n in nonces:
        assert guard.check("r", rnd, n) is not None
    state = guard.state()
    clone = ReplayGuard(max_nonces=100)
    clone.load_state(state)
    assert clone.floor == guard.floor and len(clone) == 100


def test_key_files_are_private_and_round_trip(tmp_path):
    s = Signer.generate()
    path = s.save(tmp_path / "robot_0.key")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert keys.public_key_path(path).read_text().strip() == s.public_key.hex()
    assert Signer.from_file(path).public_key == s.public_key
    os.chmod(path, 0o644)
    with pytest.raises(ValueError, match="mode 0644"):
        Signer.from_file(path)
    with pytest.raises(ValueError, match="not found"):
        Signer.from_file(tmp_path / "missing.key")


def test_allow_list_yaml_round_trip_and_errors(tmp_path, robot):
    allow = AllowList({"robot_0": robot.public_key}, server=Signer.generate().public_key)
    path = allow.to_yaml(tmp_path / "allow.yaml")
    back = AllowList.from_yaml(path)
    assert back.public_key("robot_0") == robot.public_key and back.server == allow.server
    assert back.key_matches("robot_0", robot.public_key)
    assert not back.key_matches("robot_0", Signer.generate().public_key)
    bad = tmp_path / "bad.yaml"
    bad.write_text("robots:\n  robot_1: 'abcd'\n")
    with pytest.raises(ValueError, match="robot 'robot_1'.*32 raw bytes, got 2"):
        AllowList.from_yaml(bad)
    bad.write_text("robots:\n  robot_1: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(yaml.YAMLError):  # safe_load: no code runs on load (V4)
        AllowList.from_yaml(bad)
    bad.write_text("robotz: {}\n")
    with pytest.raises(ValueError, match="unknown keys"):
        AllowList.from_yaml(bad)


def test_keys_command(tmp_path, capsys):
    out = tmp_path / "keys"
    assert keys_main(["generate", "--num-robots", "3", "--server", "--out", str(out)]) == 0
    allow = AllowList.from_yaml(out / "allow_list.yaml")
    assert allow.robot_ids == ["robot_0", "robot_1", "robot_2"] and allow.server is not None
    for name in ("robot_0", "robot_1", "robot_2", "server"):
        key = out / f"{name}.key"
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
    first = (out / "robot_0.pub").read_text()
    # Re-running keeps existing keys (no silent rotation) and extends the list.
    assert keys_main(["generate", "robot_9", "robot_0", "--out", str(out)]) == 0
    assert (out / "robot_0.pub").read_text() == first
    assert "robot_9" in AllowList.from_yaml(out / "allow_list.yaml")
    other = Signer.generate()
    assert (
        keys_main(
            ["allow", "arm_7", other.public_key.hex(), "--allow-list", str(out / "allow_list.yaml")]
        )
        == 0
    )
    assert keys_main(["revoke", "robot_9", "--allow-list", str(out / "allow_list.yaml")]) == 0
    allow = AllowList.from_yaml(out / "allow_list.yaml")
    assert "arm_7" in allow and "robot_9" not in allow
    assert keys_main(["allow", "x", "nothex", "--allow-list", str(out / "allow_list.yaml")]) == 1
    assert "not hex" in capsys.readouterr().err


def test_keys_via_cli_entry_point(tmp_path):
    """`fed-ros keys` through the real CLI dispatcher, in a fresh process."""
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "fed_ros.cli",
            "keys",
            "generate",
            "robot_0",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "robot_0.key").exists() and "allow-list" in res.stdout


def test_sros2_policy_grants_what_the_nodes_use():
    """config/security/fleet.policy.xml parses and grants the server's and robots' real topics."""
    import ast
    import xml.etree.ElementTree as ET  # our own file, not untrusted input
    from pathlib import Path

    root_dir = Path(__file__).resolve().parents[2]
    policy = ET.parse(root_dir / "config/security/fleet.policy.xml").getroot()
    enclaves = {e.get("path"): e for e in policy.iter("enclave")}
    assert {"/fleet/server", "/fleet/robot_0", "/fleet/robot_1"} <= set(enclaves)

    def granted(enclave, kind, mode):
        return {
            t.text
            for group in enclave.iter(kind + "s")
            if group.get(mode) == "ALLOW"
            for t in group
        }

    ALIASES = {"create_subscription": ("create_subscription", "subscribe")}

    def topics(node_dir: str, call: str, fleet_relative: bool) -> set[str]:
        """Topic names passed to ``<x>.<call>(Type, topic, ...)`` in the node's folder
        (``nodes/<node_dir>/``): plain names on the server, ``f"{fleet}/name"`` on a robot."""
        found = set()
        for path in sorted((root_dir / "fed_ros/ros/nodes" / node_dir).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.Call) or len(node.args) < 2:
                    continue
                # `node.create_publisher(...)`, or the node's callable passed in and called
                # as `create_publisher(...)` (`subscribe(...)` in the robot's fleet link).
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if name not in ALIASES.get(call, (call,)):
                    continue
                topic = node.args[1]
                if not fleet_relative and isinstance(topic, ast.Constant):
                    found.add(topic.value)
                elif fleet_relative and isinstance(topic, ast.JoinedStr):
                    text = ast.unparse(topic)
                    if text.startswith("f'{fleet}/"):
                        found.add("/fleet/" + text[len("f'{fleet}/") : -1])
        return found

    pubs = topics("server", "create_publisher", fleet_relative=False)
    subs = topics("server", "create_subscription", fleet_relative=False)
    assert pubs and subs
    assert pubs <= granted(enclaves["/fleet/server"], "topic", "publish")
    assert subs <= granted(enclaves["/fleet/server"], "topic", "subscribe")
    robot_pubs = topics("robot", "create_publisher", fleet_relative=True)
    robot_subs = topics("robot", "create_subscription", fleet_relative=True)
    assert robot_pubs and robot_subs
    for rid in ("robot_0", "robot_1"):
        assert robot_pubs <= granted(enclaves[f"/fleet/{rid}"], "topic", "publish")
        assert robot_subs <= granted(enclaves[f"/fleet/{rid}"], "topic", "subscribe")
        # A robot may not impersonate the server.
        assert not {"/fleet/round", "/fleet/cluster_models"} & granted(
            enclaves[f"/fleet/{rid}"], "topic", "publish"
        )
