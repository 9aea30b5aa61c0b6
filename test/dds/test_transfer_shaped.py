"""`fed-ros bench transfer --shaped`: a small measurement through a tbf-shaped link between two
network-namespace hosts (fed_ros/ros/rigs/netns.py) prints and records goodput as a fraction
of the link rate for each channel, ROS chunks paced by a Fast DDS flow controller included
(fed_ros/ros/wire/pacing.py: its nodes must start and deliver). Structure only, never a speed
threshold.

Skipped (with the reason) only where namespaces cannot be made: not root, no iproute2 (the
same check as test/slow/test_multihost.py). Every namespace the bench creates is checked to be gone.
"""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest

from fed_ros.ros.rigs import netns
from fed_ros.ros.rigs.netns import unavailable_reason

RATE_MBIT = 20
SHAPED_MB = 0.2  # 0.08 s at 20 Mbit/s: the run is dominated by process start-up and discovery
METHODS = ("raw_zmq", "ros_default", "ros_paced", "zmq_bulk")


@pytest.mark.ros
def test_bench_transfer_shaped_prints_goodput_per_channel(
    ros_env, tmp_path: Path, capsys, monkeypatch
) -> None:
    reason = unavailable_reason()
    if reason:
        pytest.skip(f"separate hosts need network namespaces: {reason}")
    from fed_ros.ros.bench.transfer import main

    made: list[netns.Network] = []

    class RecordedNetwork(netns.Network):
        def __init__(self, *a, **kw) -> None:
            super().__init__(*a, **kw)
            made.append(self)

    monkeypatch.setattr(netns, "Network", RecordedNetwork)
    out = tmp_path / "transfer.json"
    try:
        assert (
            main(
                [
                    "--methods",
                    "memcpy",
                    "--repeats",
                    "1",
                    "--warmup",
                    "0",
                    "--shaped",
                    str(RATE_MBIT),
                    "--shaped-mb",
                    str(SHAPED_MB),
                    "--shaped-methods",
                    ",".join(METHODS),
                    "--transfer-timeout",
                    "30",
                    "--json",
                    str(out),
                ]
            )
            == 0
        )
        assert len(made) == 1, "one Network per shaped rate"
        left = set(
            subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
        )
        assert made[0]._created and not left & set(made[0]._created), (
            "the bench left namespaces behind"
        )  # noqa: SLF001
    finally:
        for net in made:
            net.close()  # reap even when the bench failed half-way (a no-op when it cleaned up)
    printed = capsys.readouterr().out

    report = json.loads(out.read_text())
    shaped = report["shaped"]
    assert [(r["rate_mbit"], r["method"]) for r in shaped] == [(RATE_MBIT, m) for m in METHODS]
    nbytes = int(SHAPED_MB * 1e6) // 4 * 4
    for row in shaped:
        assert row["median_s"] is not None, (
            f"{row['method']} did not complete through the shaped link"
        )
        assert row["median_s"] > 0
        # goodput = payload bits / median time / link rate, computed for every completed method
        assert math.isclose(
            row["goodput_of_link"], nbytes * 8 / row["median_s"] / (RATE_MBIT * 1e6), rel_tol=1e-9
        )
    assert "through a tbf-shaped link" in printed and "of link" in printed
    table = printed.split("through a tbf-shaped link", 1)[1].splitlines()
    for row in shaped:
        line = next(ln for ln in table if f" {row['method']} " in ln)
        assert line.split()[-1] == f"{row['goodput_of_link']:.2f}", line


def test_paced_profile_names_one_controller_every_writer_uses(tmp_path: Path) -> None:
    """The paced profile: a FIFO flow controller at 0.95 x the link rate (per 100 ms at 1 Mbit/s),
    every writer asynchronous on it, and the RMW told to take the profile's publish mode
    (synchronous writers refuse a flow controller and the node fails to start)."""
    import xml.etree.ElementTree as ET

    from fed_ros.ros.wire import pacing

    env: dict[str, str] = {}
    path = pacing.apply_paced_profile(env, 1.0, tmp_path)
    assert env == {
        "FASTDDS_DEFAULT_PROFILES_FILE": str(path),
        "RMW_FASTRTPS_PUBLICATION_MODE": "AUTO",
    }
    ns = {"d": "http://www.eprosima.com"}
    root = ET.fromstring(path.read_text())
    (ctrl,) = root.findall(
        ".//d:participant/d:rtps/d:flow_controller_descriptor_list/d:flow_controller_descriptor", ns
    )
    assert int(ctrl.find("d:max_bytes_per_period", ns).text) == int(1e6 / 8 * 0.95 * 0.1)
    assert ctrl.find("d:period_ms", ns).text == "100"
    # a fast link gets a shorter period, so one period's burst stays under a 64 KB datagram
    assert (pacing.paced_period_ms(20), pacing.paced_bytes_per_period(20)) == (
        20,
        int(20e6 / 8 * 0.95 * 0.02),
    )
    mode = root.find(".//d:data_writer/d:qos/d:publishMode", ns)
    assert mode.find("d:kind", ns).text == "ASYNCHRONOUS"
    assert mode.find("d:flow_controller_name", ns).text == ctrl.find("d:name", ns).text
    assert root.find(".//d:participant", ns).get("is_default_profile") == "true"
    assert root.find(".//d:data_writer", ns).get("is_default_profile") == "true"
    with pytest.raises(ValueError):
        pacing.paced_bytes_per_period(0)


@pytest.mark.ros
@pytest.mark.timeout(300)
def test_bench_transfer_shaped_per_encoding_times_a_real_update_end_to_end(
    ros_env, tmp_path: Path, capsys
) -> None:
    reason = unavailable_reason()
    if reason:
        pytest.skip(f"separate hosts need network namespaces: {reason}")
    from fed_ros.core.encodings import topk
    from fed_ros.core.encodings import encoded_nbytes
    from fed_ros.learning.configuration_policy import PolicyConfig
    from fed_ros.learning.trainer import initial_state_dict
    from fed_ros.ros.bench.transfer import main

    out = tmp_path / "transfer.json"
    argv = ["--methods", "memcpy", "--repeats", "1", "--warmup", "0", "--shaped", str(RATE_MBIT)]
    argv += ["--shaped-encodings", "float32,topk:0.05", "--shaped-policy", "lowdim"]
    argv += ["--shaped-methods", "zmq_bulk", "--transfer-timeout", "30", "--json", str(out)]
    assert main(argv) == 0
    rows = json.loads(out.read_text())["shaped"]
    model = initial_state_dict(PolicyConfig(kind="lowdim"), seed=0)
    sizes = [v.size for v in model.values()]
    assert [(r["encoding"], r["bytes"]) for r in rows] == [
        ("float32", encoded_nbytes(model, "float32")),
        ("topk:0.05", topk.payload_nbytes(sizes, 0.05)),
    ]
    for row in rows:
        assert row["median_s"] is not None and row["median_s"] > 0, row
        assert row["end_to_end_s"] == pytest.approx(
            row["encode_s"] + row["median_s"] + row["decode_s"]
        )
    assert "end to end (encode + transfer + decode)" in capsys.readouterr().out
