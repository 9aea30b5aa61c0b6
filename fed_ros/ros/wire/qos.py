"""QoS profiles per stream (one place, so every node agrees on compatible settings).

- Sensor streams (camera images, joint states): best effort, keep last few. A late
  frame is worthless; retransmitting it only delays the next one.
- Model state (cluster models, the current round announcement): RELIABLE +
  TRANSIENT_LOCAL + KEEP_LAST, so a robot that joins or restarts late still receives
  the current model (nav2's map/robot_description pattern). The depth must cover every
  sample that makes up the "current state" on the topic: with several clusters sharing
  one topic and chunked models, that is clusters x chunks (see ``model_state_qos``).
- Control and updates (ModelUpdate chunks, descriptors, reports, arm commands):
  RELIABLE + VOLATILE + KEEP_ALL. Reliable + KEEP_LAST silently drops samples under
  backlog (measured, docs/transport.md); KEEP_ALL makes the publisher wait instead,
  which is what chunked transfer needs.
"""

from __future__ import annotations

from rclpy.qos import (
    DurabilityPolicy,
    HistoryPolicy,
    QoSProfile,
    ReliabilityPolicy,
    qos_profile_sensor_data,
)

# KEEP_ALL still needs a depth for the resource limits of some RMWs; Fast DDS ignores it.
_KEEP_ALL_DEPTH = 1000


def sensor_qos(depth: int = 5) -> QoSProfile:
    """Best-effort, volatile, keep-last profile for camera / joint-state streams."""
    if depth < 1:
        raise ValueError(f"sensor QoS depth must be >= 1, got {depth}")
    profile = QoSProfile(
        **{
            k: getattr(qos_profile_sensor_data, k) for k in ("reliability", "durability", "history")
        },
        depth=depth,
    )
    return profile


def model_state_qos(depth: int = 1) -> QoSProfile:
    """RELIABLE + TRANSIENT_LOCAL + KEEP_LAST(depth): late joiners get the current model.

    Use depth >= (clusters on the topic) x (chunks per model); with the zmq bulk channel
    each model is one control message, so depth = number of clusters.
    """
    if depth < 1:
        raise ValueError(f"model state QoS depth must be >= 1, got {depth}")
    return QoSProfile(
        reliability=ReliabilityPolicy.RELIABLE,
        durability=DurabilityPolicy.TRANSIENT_LOCAL,
        history=HistoryPolicy.KEEP_LAST,
        depth=depth,
    )


def latched_qos() -> QoSProfile:
    """RELIABLE + TRANSIENT_LOCAL + KEEP_LAST(1): the latest state (round announcement, plan)."""
    return model_state_qos(1)


def control_qos() -> QoSProfile:
    """RELIABLE + VOLATILE + KEEP_ALL: nothing dropped (updates, chunks, reports, commands)."""
    return QoSProfile(
        reliability=ReliabilityPolicy.RELIABLE,
        durability=DurabilityPolicy.VOLATILE,
        history=HistoryPolicy.KEEP_ALL,
        depth=_KEEP_ALL_DEPTH,
    )


def inbox_qos(depth: int = 8) -> QoSProfile:
    """RELIABLE + VOLATILE + KEEP_LAST(depth) for a reader any DDS participant can write to.

    Why not KEEP_ALL: a reader's history holds every sample the node has not taken yet, and
    for the unbounded fed_ros types Fast DDS keeps each history slot's payload buffer at the
    largest size it has held. A burst of 300 updates with 1 MB ids (2 MB samples) queued in
    the server's KEEP_ALL updates reader grew its RSS 196 -> 584 MiB (measured, issue 13).
    KEEP_LAST(depth) bounds that to ``depth`` samples; a sample pushed out by a flood is lost
    to this reader, and the transfer path recovers honest ones (resume requests for missing
    chunks, robots re-send an update until the server acknowledges it).
    """
    if depth < 1:
        raise ValueError(f"inbox QoS depth must be >= 1, got {depth}")
    return QoSProfile(
        reliability=ReliabilityPolicy.RELIABLE,
        durability=DurabilityPolicy.VOLATILE,
        history=HistoryPolicy.KEEP_LAST,
        depth=depth,
    )


def command_qos(depth: int = 10) -> QoSProfile:
    """RELIABLE + VOLATILE + KEEP_LAST(depth) for high-rate arm commands (newest wins)."""
    if depth < 1:
        raise ValueError(f"command QoS depth must be >= 1, got {depth}")
    return QoSProfile(
        reliability=ReliabilityPolicy.RELIABLE,
        durability=DurabilityPolicy.VOLATILE,
        history=HistoryPolicy.KEEP_LAST,
        depth=depth,
    )


def heartbeat_qos(depth: int = 8) -> QoSProfile:
    """BEST_EFFORT + VOLATILE + KEEP_LAST(depth) for training heartbeats (robots -> server).

    A heartbeat is worth something only while it is fresh: one lost on a bad link is replaced by
    the next (every ``heartbeat_period_s``), and a reliable writer would queue and re-send stale
    ones after an outage. KEEP_LAST bounds what any DDS participant can queue at the server.
    """
    if depth < 1:
        raise ValueError(f"heartbeat QoS depth must be >= 1, got {depth}")
    return QoSProfile(
        reliability=ReliabilityPolicy.BEST_EFFORT,
        durability=DurabilityPolicy.VOLATILE,
        history=HistoryPolicy.KEEP_LAST,
        depth=depth,
    )


# Stream name -> profile factory, for nodes that configure topics from a table.
PROFILES = {
    "sensor": sensor_qos,
    "model_state": model_state_qos,
    "latched": latched_qos,
    "control": control_qos,
    "command": command_qos,
    "inbox": inbox_qos,
    "heartbeat": heartbeat_qos,
}
