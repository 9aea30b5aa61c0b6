"""Is the arm there? The arm-side topics an adapter still lacks, each with what should provide it.

Used by the adapter's periodic "waiting for the arm" report, its reset (refused while anything
but the success button is missing) and its /diagnostics status.
"""
from __future__ import annotations

from typing import Callable, Mapping

from fed_ros.core.arm_state import ArmStateStore

# Subscription key -> the arm-state part its messages fill (cameras map to themselves).
_PARTS = {"joint_states": "joints", "eef_pose": "pose", "object_state": "object_state"}


def missing_arm_topics(subscriptions: Mapping[str, tuple], publishers: Mapping[str, tuple],
                       count_publishers: Callable[[str], int], state: ArmStateStore,
                       cameras, now: float) -> list[str]:
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
            out.append(f"{sub.topic_name} ({type_name}): no message in the last {state.state_timeout_s:g} s")
    for pub, who in publishers.values():
        if pub.get_subscription_count() == 0:
            out.append(f"{pub.topic_name}: no subscriber (is the {who} running?)")
    return out
