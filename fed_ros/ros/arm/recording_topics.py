"""What a recorder takes from an arm: the recorded topics and their message types, and the
stamps read from raw CDR bytes (images are never deserialised just to learn their stamp)."""

from __future__ import annotations

import struct

from fed_ros.ros.arm import topics as at

# Relative topic -> message type recorded from an arm.
RECORDED_TOPICS: dict[str, str] = {
    at.AGENTVIEW_TOPIC: "sensor_msgs/msg/Image",
    at.WRIST_TOPIC: "sensor_msgs/msg/Image",
    at.JOINT_STATES_TOPIC: "sensor_msgs/msg/JointState",
    at.GRIPPER_STATE_TOPIC: "sensor_msgs/msg/JointState",
    at.EEF_POSE_TOPIC: "geometry_msgs/msg/PoseStamped",
    at.OBJECT_STATE_TOPIC: "std_msgs/msg/Float32MultiArray",
    at.TASK_TOPIC: "std_msgs/msg/String",
    at.COMMAND_TOPIC: "fed_ros/msg/ArmCommand",
    at.APPLIED_COMMAND_TOPIC: "fed_ros/msg/ArmCommand",
    at.EPISODE_STATUS_TOPIC: "fed_ros/msg/EpisodeStatus",
}
# Topics every step needs; images only when the recording has cameras.
STATE_TOPICS = (
    at.JOINT_STATES_TOPIC,
    at.GRIPPER_STATE_TOPIC,
    at.EEF_POSE_TOPIC,
    at.OBJECT_STATE_TOPIC,
)
IMAGE_TOPICS = (at.AGENTVIEW_TOPIC, at.WRIST_TOPIC)
# With camera_transport "compressed" the cameras' CompressedImage streams are recorded instead,
# as they arrived (JPEG/PNG bytes); frames are decoded and resized when converted to an episode.
COMPRESSED_TOPICS = {
    at.camera_topic(rel, "compressed"): at.CAMERA_MSGTYPES["compressed"] for rel in IMAGE_TOPICS
}
SPINE_TOPICS = (at.APPLIED_COMMAND_TOPIC, at.EPISODE_STATUS_TOPIC)


def cdr_header_stamp_ns(data: bytes) -> int:
    """Stamp of a CDR message whose first field is std_msgs/Header."""
    if len(data) < 12:
        raise ValueError(f"CDR message of {len(data)} bytes is too short for a header")
    little = data[1] & 1  # encapsulation id 0x0001 = CDR little-endian
    sec, nanosec = struct.unpack_from("<iI" if little else ">iI", data, 4)
    return sec * 1_000_000_000 + nanosec


def cdr_object_state_stamp_ns(data: bytes) -> int:
    """Stamp carried in the first layout label of a CDR Float32MultiArray."""
    little = data[1] & 1
    fmt = "<I" if little else ">I"
    (count,) = struct.unpack_from(fmt, data, 4)
    if count < 1:
        raise ValueError("object state message has no layout dimension carrying its stamp")
    (length,) = struct.unpack_from(fmt, data, 8)
    return at.parse_object_state_label(
        bytes(data[12 : 12 + max(0, length - 1)]).decode("utf-8", "replace")
    )


def peek_stamp(rel: str, data: bytes) -> int | None:
    """Stamp of a raw message on arm topic ``rel`` (None for the unstamped task topic)."""
    if rel == at.OBJECT_STATE_TOPIC:
        return cdr_object_state_stamp_ns(data)
    if rel == at.TASK_TOPIC:
        return None
    return cdr_header_stamp_ns(data)


def relative_topic(topic: str) -> str:
    """The arm-relative name of a recorded topic (ValueError when it is none)."""
    for rel in {**RECORDED_TOPICS, **COMPRESSED_TOPICS}:
        if topic == rel or topic.endswith("/" + rel):
            return rel
    raise ValueError(f"topic {topic!r} is not an arm topic")


def peek_human_control(data: bytes) -> bool:
    """``human_control`` of a serialized EpisodeStatus (False when unreadable)."""
    from rclpy.serialization import deserialize_message

    try:
        msg_type = at.message_class(RECORDED_TOPICS[at.EPISODE_STATUS_TOPIC])
        return bool(deserialize_message(bytes(data), msg_type).human_control)
    except Exception:  # noqa: BLE001 - a malformed message is reported by the conversion
        return False
