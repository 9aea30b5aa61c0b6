"""The arm's inputs to the adapter, and which of them are missing.

:func:`subscribe_arm_side` makes the adapter's subscriptions to the arm's standard topics
(joint states, end-effector pose, perception, the success button, cameras), each with its
message type and what usually publishes it; :func:`missing_arm_topics` says which are not there
yet. Used by the adapter's periodic "waiting for the arm" report, its reset (refused while
anything but the success button is missing) and its /diagnostics status.
"""

from __future__ import annotations

from typing import Callable, Mapping

from fed_ros.core.arm.state import ArmStateStore


def subscribe_arm_side(
    create_subscription: Callable,
    profile,
    cameras: Mapping,
    handlers: Mapping[str, Callable],
    callback_group=None,
) -> dict[str, tuple]:
    """The adapter's arm-side subscriptions: key -> (subscription, type name, what publishes it).

    ``handlers``: joint_states, eef_pose, object_state, task_success (each ``msg -> None``) and
    camera (``(camera, compressed, msg) -> None``). Best-effort sensor subscriptions match both
    reliable (joint_state_broadcaster) and best-effort (camera driver) publishers; only the
    newest sample is used. The success button is reliable: a press must not be lost.
    """
    from geometry_msgs.msg import PoseStamped
    from sensor_msgs.msg import CompressedImage, Image, JointState
    from std_msgs.msg import Bool, Float32MultiArray

    from fed_ros.ros.wire import qos

    t = profile.topics
    sensor = qos.sensor_qos(depth=5)

    def sub(msg_type, topic, handler, qos_profile=sensor):
        return create_subscription(
            msg_type, topic, handler, qos_profile, callback_group=callback_group
        )

    subs = {
        "joint_states": (
            sub(JointState, t.joint_states, handlers["joint_states"]),
            "sensor_msgs/JointState",
            "joint_state_broadcaster",
        ),
        "eef_pose": (
            sub(PoseStamped, t.eef_pose, handlers["eef_pose"]),
            "geometry_msgs/PoseStamped",
            "a TF -> pose relay",
        ),
    }
    if t.object_state:
        subs["object_state"] = (
            sub(Float32MultiArray, t.object_state, handlers["object_state"]),
            "std_msgs/Float32MultiArray",
            "perception",
        )
    if t.task_success:
        subs["task_success"] = (
            sub(Bool, t.task_success, handlers["task_success"], qos.command_qos(depth=10)),
            "std_msgs/Bool",
            "operator button / success detector",
        )
    for cam, cfg in cameras.items():
        msg_type = CompressedImage if cfg.compressed else Image
        handler = (lambda c, z: lambda m: handlers["camera"](c, z, m))(cam, cfg.compressed)
        subs[cam] = (
            sub(msg_type, cfg.topic, handler),
            f"sensor_msgs/{msg_type.__name__}",
            "camera driver",
        )
    return subs


# Subscription key -> the arm-state part its messages fill (cameras map to themselves).
_PARTS = {"joint_states": "joints", "eef_pose": "pose", "object_state": "object_state"}


def missing_arm_topics(
    subscriptions: Mapping[str, tuple],
    publishers: Mapping[str, tuple],
    count_publishers: Callable[[str], int],
    state: ArmStateStore,
    cameras,
    now: float,
) -> list[str]:
    """What is missing: a subscribed topic without publisher or without a fresh message, a
    command topic without subscriber.

    ``subscriptions``: key -> (subscription, type name, what usually publishes it);
    ``publishers``: key -> (publisher, what should subscribe); ``count_publishers``: the node's.
    """
    parts = dict(_PARTS, **{cam: cam for cam in cameras})
    out = []
    for key, (sub, type_name, who) in subscriptions.items():
        if count_publishers(sub.topic_name) == 0:
            out.append(f"{sub.topic_name} ({type_name}, from {who}): no publisher")
        elif key in parts and state.fresh(parts[key], now) is None:
            out.append(
                f"{sub.topic_name} ({type_name}): "
                f"no message in the last {state.state_timeout_s:g} s"
            )
    for pub, who in publishers.values():
        if pub.get_subscription_count() == 0:
            out.append(f"{pub.topic_name}: no subscriber (is the {who} running?)")
    return out
