"""Fast DDS with larger UDP socket buffers: ROS chunks without repair traffic between hosts.

Why (measured, docs/transport.md "Wire bytes of ROS chunks"): Fast DDS sends a sample's
fragments back to back as ~64 KB UDP datagrams; with its default the receiving socket gets the
kernel's default buffer (``net.core.rmem_default``, 208 KiB on Linux). A 594 KB float32 update
arrives faster than a loaded receiver drains the socket, so whole datagrams are dropped there
(``RcvbufErrors`` in ``/proc/net/snmp``) and Fast DDS repairs each one (NACK_FRAG): the link
carries the payload 1.0-4.0x over, more under load. An update smaller than the buffer (a
146 KB int8_delta one) is not dropped (1.06x: headers only).

A receive buffer above the largest ROS-chunk sample removes the drops. The kernel caps what a
process may ask for at ``net.core.rmem_max`` (208 KiB on a stock Ubuntu, silently), so a host
needs both: ``sysctl -w net.core.rmem_max=4194304`` (root, once per boot, or a sysctl.d file)
and this profile loaded by every fed_ros process
(``python -m fed_ros.ros.wire.socket_buffers > buffers.xml``, then
``FASTDDS_DEFAULT_PROFILES_FILE=buffers.xml``). It is a deployment setting like
:mod:`fed_ros.ros.wire.pacing`; the two do not combine in one file (one default profile).
"""

from __future__ import annotations

import sys
from collections.abc import MutableMapping
from pathlib import Path

# 4 MiB: above one 4 MiB ROS chunk (chunk_sender.DEFAULT_CHUNK_BYTES), so even a whole chunk
# sent as one burst fits; the kernel's rmem_max must allow it.
DEFAULT_BUFFER_BYTES = 4 << 20
MIN_BUFFER_BYTES = 65_536  # below one Fast DDS datagram the profile would make things worse
UDP_TRANSPORT = "fed_ros_udp_buffers"
SHM_TRANSPORT = "fed_ros_shm"


def buffers_fastdds_profile(buffer_bytes: int = DEFAULT_BUFFER_BYTES) -> str:
    """Fast DDS XML: the default participant's UDP send and receive sockets at ``buffer_bytes``,
    beside shared memory as Fast DDS's builtin transports have it."""
    if not isinstance(buffer_bytes, int) or buffer_bytes < MIN_BUFFER_BYTES:
        raise ValueError(
            f"buffer_bytes must be an int >= {MIN_BUFFER_BYTES} (one datagram), got "
            f"{buffer_bytes!r}"
        )
    # The participant-level sendSocketBufferSize / listenSocketBufferSize leave the builtin
    # transports' sockets at the kernel default (read back with `ss -m` under Kilted's Fast DDS);
    # only a user UDPv4 transport takes the sizes, so SHM is declared again beside it.
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<!-- fed_ros: UDP socket buffers of {buffer_bytes} bytes; the kernel caps them at
     net.core.rmem_max / wmem_max (fed_ros/ros/wire/socket_buffers.py). -->
<dds xmlns="http://www.eprosima.com">
  <profiles>
    <transport_descriptors>
      <transport_descriptor>
        <transport_id>{UDP_TRANSPORT}</transport_id>
        <type>UDPv4</type>
        <sendBufferSize>{buffer_bytes}</sendBufferSize>
        <receiveBufferSize>{buffer_bytes}</receiveBufferSize>
      </transport_descriptor>
      <transport_descriptor>
        <transport_id>{SHM_TRANSPORT}</transport_id>
        <type>SHM</type>
      </transport_descriptor>
    </transport_descriptors>
    <participant profile_name="fed_ros_socket_buffers" is_default_profile="true">
      <rtps>
        <userTransports>
          <transport_id>{UDP_TRANSPORT}</transport_id>
          <transport_id>{SHM_TRANSPORT}</transport_id>
        </userTransports>
        <useBuiltinTransports>false</useBuiltinTransports>
      </rtps>
    </participant>
  </profiles>
</dds>
"""


def apply_buffers_profile(
    env: MutableMapping[str, str], directory: Path, buffer_bytes: int = DEFAULT_BUFFER_BYTES
) -> Path:
    """Write the profile into ``directory`` and point ``env`` (a child's environment) at it."""
    path = Path(directory) / f"fastdds_buffers_{buffer_bytes}.xml"
    path.write_text(buffers_fastdds_profile(buffer_bytes))
    env["FASTDDS_DEFAULT_PROFILES_FILE"] = str(path)
    return path


if __name__ == "__main__":
    if len(sys.argv) > 2:
        sys.exit("usage: python -m fed_ros.ros.wire.socket_buffers [BYTES] > buffers.xml")
    try:
        size = int(sys.argv[1]) if len(sys.argv) == 2 else DEFAULT_BUFFER_BYTES
        print(buffers_fastdds_profile(size), end="")
    except ValueError as err:
        sys.exit(str(err))
