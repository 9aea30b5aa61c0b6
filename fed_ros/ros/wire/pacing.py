"""Fast DDS pacing for slow links: a flow controller that keeps ROS chunks under the link rate.

Why ROS chunks stall on a slow link without it (measured, docs/transport.md "Through a shaped
link"): Fast DDS sends a sample's fragments back to back as ~64 KB UDP datagrams (IP-fragmented
into ~45 packets). A link whose queue holds less than one datagram (tbf at 1 Mbit/s with 400 ms
latency and a 4 KB burst: ~54 KB) drops the tail of every datagram, so every datagram is lost
and every retransmission fails the same way: the writer sends ~10x the payload and the sample
never arrives. A flow controller (``max_bytes_per_period`` every ``period_ms``) both spaces
the bytes out and caps the fragment size at ``max_bytes_per_period``, so nothing overflows.

rmw_fastrtps publishes synchronously by default, and Fast DDS refuses a flow controller on a
synchronous writer ("Cannot use a flow controller in synchronously publication mode", the node
then fails to start); ``RMW_FASTRTPS_PUBLICATION_MODE=AUTO`` makes it take the profile's
asynchronous mode. :func:`apply_paced_profile` sets both variables for a child environment.

The rate is per link (a profile for 1 Mbit/s caps a 20 Mbit/s link at 0.95 Mbit/s), so this is
a deployment setting: ``python -m fed_ros.ros.wire.pacing 1 > paced.xml`` prints the profile
for a 1 Mbit/s link. Use it for hosts that reach each other only through DDS; otherwise
``transfer_channel: zmq`` (TCP adapts to the link by itself) is simpler.
"""

from __future__ import annotations

import sys
from collections.abc import MutableMapping
from pathlib import Path

CONTROLLER = "fed_ros_link_rate"
DEFAULT_FRACTION = 0.95  # of the link rate: room for discovery, heartbeats and ACKs
MAX_PERIOD_MS = 100
# Bytes one period may carry on a fast link: below one 64 KB datagram. Shorter periods on fast
# links (measured, 1 MB through tbf 20 Mbit/s: period 100 ms 0.80 of the link, 20 ms 0.91);
# at 1 Mbit/s the period stays 100 ms (11.9 KB; 20 ms gave 0.87 instead of 0.93: more fragments).
PERIOD_BYTES = 48_000


def paced_period_ms(rate_mbit: float, fraction: float = DEFAULT_FRACTION) -> int:
    """The controller's period: 100 ms, shorter on fast links so one period carries <= 48 KB."""
    if rate_mbit <= 0 or not 0 < fraction <= 1:
        raise ValueError(f"need rate_mbit > 0 and 0 < fraction <= 1 (got {rate_mbit}, {fraction})")
    return max(1, min(MAX_PERIOD_MS, int(PERIOD_BYTES / (rate_mbit * 1e6 / 8 * fraction) * 1000)))


def paced_bytes_per_period(
    rate_mbit: float, fraction: float = DEFAULT_FRACTION, period_ms: int | None = None
) -> int:
    """Bytes a writer may send per period to stay at ``fraction`` of a ``rate_mbit`` link."""
    period_ms = paced_period_ms(rate_mbit, fraction) if period_ms is None else period_ms
    if rate_mbit <= 0 or not 0 < fraction <= 1 or period_ms < 1:
        raise ValueError(
            f"need rate_mbit > 0, 0 < fraction <= 1, period_ms >= 1 (got {rate_mbit}, {fraction}, "
            f"{period_ms})"
        )
    return max(1500, int(rate_mbit * 1e6 / 8 * fraction * period_ms / 1000))


def paced_fastdds_profile(
    rate_mbit: float, fraction: float = DEFAULT_FRACTION, period_ms: int | None = None
) -> str:
    """Fast DDS XML: default participant with one FIFO flow controller; every writer asynchronous on
    it."""
    period_ms = paced_period_ms(rate_mbit, fraction) if period_ms is None else period_ms
    per_period = paced_bytes_per_period(rate_mbit, fraction, period_ms)
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<!-- fed_ros: ROS chunks paced to {fraction:g} x {rate_mbit:g} Mbit/s \
({per_period} bytes every {period_ms} ms).
     Needs RMW_FASTRTPS_PUBLICATION_MODE=AUTO (fed_ros/ros/wire/pacing.py). -->
<dds xmlns="http://www.eprosima.com">
  <profiles>
    <participant profile_name="fed_ros_paced" is_default_profile="true">
      <rtps>
        <flow_controller_descriptor_list>
          <flow_controller_descriptor>
            <name>{CONTROLLER}</name>
            <scheduler>FIFO</scheduler>
            <max_bytes_per_period>{per_period}</max_bytes_per_period>
            <period_ms>{period_ms}</period_ms>
          </flow_controller_descriptor>
        </flow_controller_descriptor_list>
      </rtps>
    </participant>
    <data_writer profile_name="fed_ros_paced_writer" is_default_profile="true">
      <qos>
        <publishMode>
          <kind>ASYNCHRONOUS</kind>
          <flow_controller_name>{CONTROLLER}</flow_controller_name>
        </publishMode>
      </qos>
    </data_writer>
  </profiles>
</dds>
"""


def apply_paced_profile(
    env: MutableMapping[str, str], rate_mbit: float, directory: Path, **kw
) -> Path:
    """Write the paced profile for ``rate_mbit`` into ``directory`` and point ``env`` at it."""
    path = Path(directory) / f"fastdds_paced_{rate_mbit:g}mbit.xml"
    path.write_text(paced_fastdds_profile(rate_mbit, **kw))
    env["FASTDDS_DEFAULT_PROFILES_FILE"] = str(path)
    env["RMW_FASTRTPS_PUBLICATION_MODE"] = "AUTO"  # else the flow controller is refused (see above)
    return path


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m fed_ros.ros.wire.pacing LINK_MBIT > paced.xml")
    print(paced_fastdds_profile(float(sys.argv[1])), end="")
