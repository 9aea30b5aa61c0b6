"""The arm interface: topic names under an arm namespace, their QoS and message codecs.

Every arm (MuJoCo bridge or real driver) offers the same topics (docs/contracts.md,
"Topics"), relative to the robot namespace (``/robot_<i>``):

    arm/agentview/image_raw   sensor_msgs/Image (rgb8)          sensor-data QoS
    arm/wrist/image_raw       sensor_msgs/Image (rgb8)          sensor-data QoS
      (or, with camera_transport "compressed", ``<camera>/image_raw/compressed``
      sensor_msgs/CompressedImage JPEG/PNG, as image_transport names them)
    arm/joint_states          sensor_msgs/JointState            sensor-data QoS
    arm/gripper_state         sensor_msgs/JointState (fingers)  sensor-data QoS
    arm/eef_pose              geometry_msgs/PoseStamped         sensor-data QoS
    arm/object_state          std_msgs/Float32MultiArray        sensor-data QoS
    arm/task                  std_msgs/String (instruction)     reliable, transient local
    arm/command               fed_ros/ArmCommand                control QoS (in)
    arm/applied_command       fed_ros/ArmCommand                control QoS (out)
    arm/episode_status        fed_ros/EpisodeStatus             control QoS
    arm/reset                 fed_ros/srv/ResetEpisode          service

Synchronisation rule: all observation messages of one control tick carry the same
``header.stamp`` (the tick's stamp). ``Float32MultiArray`` has no header, so the bridge
writes the stamp into its first layout dimension's label (``object_state@<sec>.<nsec>``).
``arm/applied_command`` is the command the driver actually applied to the observation
stamped ``header.stamp`` (``MODE_HOLD`` with zero action when it held still); a policy
stamps its ``arm/command`` with the stamp of the observation it answered.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fed_ros.core.arm.safety import MODE_HOLD
from fed_ros.core.data.episode import (
    AGENTVIEW_IMAGE,
    EEF_POS,
    EEF_QUAT,
    GRIPPER_QPOS,
    JOINT_POS,
    OBJECT_STATE,
    OBJECT_STATE_DIM,
    WRIST_IMAGE,
)

# Relative names (resolved in the node's namespace, or prefixed by ArmTopics.namespace).
AGENTVIEW_TOPIC = "arm/agentview/image_raw"
WRIST_TOPIC = "arm/wrist/image_raw"
JOINT_STATES_TOPIC = "arm/joint_states"
GRIPPER_STATE_TOPIC = "arm/gripper_state"
EEF_POSE_TOPIC = "arm/eef_pose"
OBJECT_STATE_TOPIC = "arm/object_state"
TASK_TOPIC = "arm/task"
COMMAND_TOPIC = "arm/command"
APPLIED_COMMAND_TOPIC = "arm/applied_command"
EPISODE_STATUS_TOPIC = "arm/episode_status"
RESET_SERVICE = "arm/reset"

OBJECT_STATE_LABEL_PREFIX = "object_state@"


def _join(namespace: str, name: str) -> str:
    namespace = namespace.rstrip("/")
    return f"{namespace}/{name}" if namespace else name


@dataclass(frozen=True)
class ArmTopics:
    """Topic and service names of one arm; ``namespace`` "" keeps them node-relative."""

    namespace: str = ""

    def __post_init__(self) -> None:
        if self.namespace and not self.namespace.startswith("/"):
            raise ValueError(f"arm namespace must be absolute or empty, got {self.namespace!r}")

    def name(self, relative: str) -> str:
        """Full name of a relative arm topic (e.g. ``arm/command``)."""
        return _join(self.namespace, relative)

    @property
    def agentview_image(self) -> str:
        return self.name(AGENTVIEW_TOPIC)

    @property
    def wrist_image(self) -> str:
        return self.name(WRIST_TOPIC)

    @property
    def joint_states(self) -> str:
        return self.name(JOINT_STATES_TOPIC)

    @property
    def gripper_state(self) -> str:
        return self.name(GRIPPER_STATE_TOPIC)

    @property
    def eef_pose(self) -> str:
        return self.name(EEF_POSE_TOPIC)

    @property
    def object_state(self) -> str:
        return self.name(OBJECT_STATE_TOPIC)

    @property
    def task(self) -> str:
        return self.name(TASK_TOPIC)

    @property
    def command(self) -> str:
        return self.name(COMMAND_TOPIC)

    @property
    def applied_command(self) -> str:
        return self.name(APPLIED_COMMAND_TOPIC)

    @property
    def episode_status(self) -> str:
        return self.name(EPISODE_STATUS_TOPIC)

    @property
    def reset(self) -> str:
        return self.name(RESET_SERVICE)


# --- stamps -----------------------------------------------------------------------------


def stamp_to_ns(stamp) -> int:
    """builtin_interfaces/Time -> integer nanoseconds (the synchronisation key)."""
    return int(stamp.sec) * 1_000_000_000 + int(stamp.nanosec)


def ns_to_stamp(ns: int):
    """Integer nanoseconds -> builtin_interfaces/Time."""
    from builtin_interfaces.msg import Time

    return Time(sec=int(ns // 1_000_000_000), nanosec=int(ns % 1_000_000_000))


def object_state_label(stamp_ns: int) -> str:
    """Layout label that carries the tick stamp of a (headerless) object state message."""
    return f"{OBJECT_STATE_LABEL_PREFIX}{stamp_ns // 1_000_000_000}.{stamp_ns % 1_000_000_000:09d}"


def object_state_stamp_ns(msg) -> int:
    """Tick stamp of an object-state Float32MultiArray; ValueError when it carries none."""
    dims = msg.layout.dim
    return parse_object_state_label(dims[0].label if dims else "")


def parse_object_state_label(label: str) -> int:
    """Stamp (ns) written by :func:`object_state_label`; ValueError on any other label."""
    if not label.startswith(OBJECT_STATE_LABEL_PREFIX):
        raise ValueError(f"object state message has no stamp label (label {label!r})")
    sec, _, nsec = label[len(OBJECT_STATE_LABEL_PREFIX) :].partition(".")
    try:
        return int(sec) * 1_000_000_000 + int(nsec)
    except ValueError:
        raise ValueError(f"object state stamp label {label!r} is malformed") from None


# --- QoS and message types per topic -------------------------------------------------------

# Camera transports the robot side accepts: "raw" sensor_msgs/Image on ``.../image_raw``,
# "compressed" sensor_msgs/CompressedImage (JPEG/PNG) on ``.../image_raw/compressed``.
CAMERA_TRANSPORTS = ("raw", "compressed")
COMPRESSED_SUFFIX = "/compressed"
CAMERA_MSGTYPES = {"raw": "sensor_msgs/msg/Image", "compressed": "sensor_msgs/msg/CompressedImage"}


def camera_topic(relative: str, transport: str = "raw") -> str:
    """Relative camera topic of a transport (``arm/wrist/image_raw[/compressed]``)."""
    if transport not in CAMERA_TRANSPORTS:
        raise ValueError(f"camera transport must be one of {CAMERA_TRANSPORTS}, got {transport!r}")
    return relative + (COMPRESSED_SUFFIX if transport == "compressed" else "")


def camera_from_msg(msg, transport: str = "raw", size: int = 0) -> np.ndarray:
    """Image or CompressedImage -> HxWx3 uint8 RGB resized to ``size`` (0: as it came)."""
    if transport == "raw" and not size:
        return image_from_msg(msg)
    from fed_ros.ros.wire.images import decode_camera

    return decode_camera(msg, transport == "compressed", size)


# Subscribers keep a deeper sensor history than the publisher so a busy executor does not
# lose a tick's image before the recorder or the policy has read it.
SENSOR_TOPICS = frozenset(
    {
        AGENTVIEW_TOPIC,
        WRIST_TOPIC,
        JOINT_STATES_TOPIC,
        GRIPPER_STATE_TOPIC,
        EEF_POSE_TOPIC,
        OBJECT_STATE_TOPIC,
        AGENTVIEW_TOPIC + COMPRESSED_SUFFIX,
        WRIST_TOPIC + COMPRESSED_SUFFIX,
    }
)


# Observation queue of a recorder: 5 s at 20 Hz. A recorder must keep every step while a
# loaded computer stalls its executor; best-effort samples beyond the queue are dropped.
RECORDER_SENSOR_DEPTH = 100


def qos_for(relative_topic: str, subscriber: bool = True, recorder: bool = False):
    """QoS profile of an arm topic (publisher and subscriber profiles are compatible).

    ``recorder``: a subscriber that needs every observation, not only the newest.
    """
    from fed_ros.ros.wire import qos

    if relative_topic in SENSOR_TOPICS:
        return qos.sensor_qos(depth=RECORDER_SENSOR_DEPTH if recorder else 10 if subscriber else 5)
    if relative_topic == TASK_TOPIC:
        return qos.latched_qos()
    if relative_topic in (COMMAND_TOPIC, APPLIED_COMMAND_TOPIC, EPISODE_STATUS_TOPIC):
        # Reliable, newest wins; a deep queue so a recorder never loses a step at 20 Hz.
        return qos.command_qos(depth=10 if relative_topic == COMMAND_TOPIC else 100)
    raise ValueError(f"unknown arm topic {relative_topic!r}")


def message_class(msgtype: str):
    """Python class of a message type name such as ``sensor_msgs/msg/Image``."""
    import importlib

    parts = msgtype.split("/")
    if len(parts) != 3:
        raise ValueError(f"message type must be 'pkg/msg/Name', got {msgtype!r}")
    module = importlib.import_module(f"{parts[0]}.{parts[1]}")
    try:
        return getattr(module, parts[2])
    except AttributeError:
        raise ValueError(f"no message type {msgtype!r}") from None


# --- message <-> numpy -------------------------------------------------------------------


def image_to_msg(image: np.ndarray, stamp, frame_id: str):
    """HxWx3 uint8 (upright) -> sensor_msgs/Image rgb8 (fed_ros.ros.wire.images, one copy)."""
    from fed_ros.ros.wire.images import image_to_msg as _to_msg

    image = np.asarray(image)
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"expected HxWx3 uint8 image, got {image.dtype} {image.shape}")
    return _to_msg(image, "rgb8", frame_id=frame_id, stamp=stamp)


def image_from_msg(msg) -> np.ndarray:
    """sensor_msgs/Image (rgb8 / bgr8 / rgba8 / bgra8) -> HxWx3 uint8 RGB, owning its memory."""
    from fed_ros.ros.wire.images import msg_to_image

    if msg.encoding not in ("rgb8", "bgr8", "rgba8", "bgra8"):
        raise ValueError(f"unsupported camera image encoding {msg.encoding!r} (expected rgb8)")
    image = msg_to_image(msg, desired_encoding="rgb8", backend="own")
    # The decoded view borrows the message buffer; observations outlive the message.
    return np.array(image[..., :3], dtype=np.uint8, copy=True)


# --- observation -> messages (what an arm driver publishes each tick) -----------------------


def observation_messages(
    obs: dict[str, np.ndarray],
    stamp_ns: int,
    *,
    joint_names,
    gripper_names,
    joint_vel: np.ndarray | None = None,
    gripper_vel: np.ndarray | None = None,
    frame_prefix: str = "",
) -> dict[str, object]:
    """One tick's observation as messages keyed by relative topic, all stamped ``stamp_ns``."""
    from geometry_msgs.msg import PoseStamped
    from sensor_msgs.msg import JointState
    from std_msgs.msg import Float32MultiArray, MultiArrayDimension

    stamp = ns_to_stamp(stamp_ns)
    out: dict[str, object] = {}
    for key, rel, frame in (
        (AGENTVIEW_IMAGE, AGENTVIEW_TOPIC, "agentview_camera"),
        (WRIST_IMAGE, WRIST_TOPIC, "wrist_camera"),
    ):
        if key in obs:
            out[rel] = image_to_msg(obs[key], stamp, frame_prefix + frame)

    def joint_state(names, positions, velocities):
        msg = JointState()
        msg.header.stamp = stamp
        msg.name = [str(n) for n in names]
        msg.position = np.asarray(positions, dtype=float).tolist()
        if velocities is not None:
            msg.velocity = np.asarray(velocities, dtype=float).tolist()
        if len(msg.name) != len(msg.position):
            raise ValueError(f"{len(msg.name)} joint names for {len(msg.position)} positions")
        return msg

    out[JOINT_STATES_TOPIC] = joint_state(joint_names, obs[JOINT_POS], joint_vel)
    out[GRIPPER_STATE_TOPIC] = joint_state(gripper_names, obs[GRIPPER_QPOS], gripper_vel)
    pose = PoseStamped()
    pose.header.stamp = stamp
    pose.header.frame_id = frame_prefix + "base"
    p, q = (np.asarray(obs[EEF_POS], dtype=float), np.asarray(obs[EEF_QUAT], dtype=float))
    pose.pose.position.x, pose.pose.position.y, pose.pose.position.z = (float(v) for v in p)
    (
        pose.pose.orientation.x,
        pose.pose.orientation.y,
        pose.pose.orientation.z,
        pose.pose.orientation.w,
    ) = (float(v) for v in q)
    out[EEF_POSE_TOPIC] = pose
    state = np.asarray(obs[OBJECT_STATE], dtype=np.float32)
    objects = Float32MultiArray()
    objects.layout.dim = [
        MultiArrayDimension(
            label=object_state_label(stamp_ns), size=int(state.size), stride=int(state.size)
        )
    ]
    objects.data = state.tolist()
    out[OBJECT_STATE_TOPIC] = objects
    return out


# --- messages -> observation parts (what fed_ros.ros.arm.observation_assembly joins) -------


def decode_joint_state(msg) -> tuple[np.ndarray, np.ndarray]:
    """JointState -> (positions, velocities) float32 (velocities zero when absent)."""
    pos = np.asarray(msg.position, dtype=np.float32)
    vel = np.asarray(msg.velocity, dtype=np.float32) if len(msg.velocity) else np.zeros_like(pos)
    return pos, vel


def decode_pose(msg) -> tuple[np.ndarray, np.ndarray]:
    """PoseStamped -> (position (3,), quaternion xyzw (4,)) float32."""
    p, q = msg.pose.position, msg.pose.orientation
    return (
        np.array([p.x, p.y, p.z], dtype=np.float32),
        np.array([q.x, q.y, q.z, q.w], dtype=np.float32),
    )


def decode_object_state(msg) -> np.ndarray:
    """Float32MultiArray -> (OBJECT_STATE_DIM,) float32; ValueError on a wrong size."""
    data = np.asarray(msg.data, dtype=np.float32)
    if data.shape != (OBJECT_STATE_DIM,):
        raise ValueError(f"object state has {data.size} values, expected {OBJECT_STATE_DIM}")
    return data


def applied_command_msg(msg, out, stamp_ns: int, frame_id: str):
    """Fill ``msg`` (a fed_ros/ArmCommand) with what one tick applied (a core.arm_safety
    TickOutput), stamped with the observation it answered; a hold is MODE_HOLD with zero
    action."""
    msg.header.stamp = ns_to_stamp(stamp_ns)
    msg.header.frame_id = frame_id
    hold = out.kind == "hold"
    msg.mode = MODE_HOLD if hold else int(out.applied_mode)
    msg.action = [0.0, 0.0, 0.0] if hold else [float(v) for v in out.applied_action]
    msg.gripper = float(out.applied_gripper)
    msg.source = "hold" if hold else "policy"
    return msg
