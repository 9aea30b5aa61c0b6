"""The suite's own helpers (test/conftest.py): exclusive ROS domain ids and condition waits."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import exclusive_domain_id, wait_until  # noqa: E402

from fed_ros.ros.rigs import domains  # noqa: E402


@pytest.fixture
def private_domains(monkeypatch, tmp_path):
    """Two domain ids and a private lock directory, so the test never touches real runs' locks."""
    monkeypatch.setattr(domains, "DOMAIN_IDS", range(40, 42))
    monkeypatch.setattr(domains, "DOMAIN_LOCK_DIR", tmp_path / "locks")
    return tmp_path / "locks"


def test_two_holders_never_share_a_domain_id(private_domains):
    with exclusive_domain_id() as first, exclusive_domain_id() as second:
        assert first != second


def test_all_domain_ids_held_raises(private_domains):
    with exclusive_domain_id(), exclusive_domain_id():
        with pytest.raises(RuntimeError, match="every ROS domain id 40-41 is held"):
            with exclusive_domain_id():
                pass


def test_released_domain_id_can_be_taken_again(private_domains):
    with exclusive_domain_id():
        pass
    with exclusive_domain_id() as a, exclusive_domain_id() as b:
        assert {a, b} == {40, 41}


def test_another_process_cannot_take_a_held_domain_id(private_domains):
    code = (
        "import fcntl, sys; f = open(sys.argv[1], 'a')\n"
        "try:\n    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB); print('taken')\n"
        "except BlockingIOError:\n    print('held')\n"
    )
    with exclusive_domain_id() as domain:
        out = subprocess.run(
            [sys.executable, "-c", code, str(private_domains / f"{domain}.lock")],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    assert out == "held"


def test_domain_ids_stay_below_the_ephemeral_port_range():
    # Fast DDS: 7400 + 250 d + 10 + 2 p; Linux's ephemeral ports start at 32768.
    assert (
        min(domains.DOMAIN_IDS) >= 0 and 7400 + 250 * max(domains.DOMAIN_IDS) + 10 + 2 * 50 < 32768
    )


def test_wait_until_returns_the_truthy_value():
    values = iter([0, None, "ready"])
    assert wait_until(lambda: next(values), timeout=60, what="a value", interval=0) == "ready"


def test_wait_until_names_what_it_waited_for_on_timeout():
    with pytest.raises(AssertionError, match="waiting for the peer\nlog tail"):
        wait_until(lambda: False, timeout=0, what="the peer", diagnostics=lambda: "log tail")
