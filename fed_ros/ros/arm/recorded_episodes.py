"""Reading recordings back: a finished rosbag2/MCAP recording -> :class:`Episode`.

Synchronisation rule (see :mod:`fed_ros.ros.arm.topics`): step ``k`` of the episode is
the ``arm/applied_command`` stamped ``s_k`` (the action the driver applied) paired with
the observation messages stamped ``s_k``. Recorded actions therefore are exactly the
applied ones, whether the command came late, was rejected or the arm held still.
Episode metadata (robot, task, instruction, variation, success) lives in the bag's
``custom_data``; a converted episode is cached as ``episode.npz`` beside the bag.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import yaml

from fed_ros.core.data.episode import (
    ACTION_DIM,
    AGENTVIEW_IMAGE,
    EEF_POS,
    EEF_QUAT,
    Episode,
    GRIPPER_QPOS,
    JOINT_POS,
    OBJECT_STATE,
    WRIST_IMAGE,
)
from fed_ros.core.data.quarantine import is_quarantined
from fed_ros.ros.arm import topics as at
from fed_ros.ros.arm.recording_topics import (
    IMAGE_TOPICS,
    RECORDED_TOPICS,
    SPINE_TOPICS,
    STATE_TOPICS,
    cdr_header_stamp_ns,
    relative_topic,
)
from fed_ros.ros.arm.rosbag2_mcap import METADATA_FILE

EPISODE_CACHE = "episode.npz"


class RecordingError(ValueError):
    """A recording that cannot become a training episode (names the reason)."""


def read_recording_metadata(path: str | Path) -> dict[str, Any]:
    """The ``rosbag2_bagfile_information`` of a recording (RecordingError when incomplete)."""
    path = Path(path)
    meta_file = path / METADATA_FILE
    if not meta_file.is_file():
        raise RecordingError(f"{path} is not a finished recording (no {METADATA_FILE})")
    info = yaml.safe_load(meta_file.read_text()) or {}
    try:
        return info["rosbag2_bagfile_information"]
    except (KeyError, TypeError):
        raise RecordingError(f"{meta_file} has no rosbag2_bagfile_information") from None


def _bool(text: str) -> bool:
    return str(text).strip().lower() in ("true", "1", "yes")


def recording_to_episode(
    path: str | Path,
    *,
    allow_failed: bool = False,
    use_cache: bool = True,
    max_dropped_fraction: float = 0.1,
) -> Episode:
    """Convert a recording into an :class:`Episode` (cached as ``episode.npz`` beside it).

    Failed episodes are refused unless ``allow_failed`` (they are never trained on).
    Steps whose observation lost a sample are dropped; more than ``max_dropped_fraction``
    of them, or a required topic without messages, raises :class:`RecordingError`. So does a
    success in which the arm never moved (docs/arms.md): nothing in it can be learned.
    """
    from mcap.reader import make_reader
    from rclpy.serialization import deserialize_message

    path = Path(path)
    info = read_recording_metadata(path)
    custom = {str(k): str(v) for k, v in (info.get("custom_data") or {}).items()}
    success = _bool(custom.get("success", "false"))
    if not success and not allow_failed:
        raise RecordingError(
            f"recording {path} is marked failed (success=false); "
            "failed episodes are never trained on"
        )
    cache = path / EPISODE_CACHE
    files = [path / f for f in info.get("relative_file_paths", [])]
    if not files or not all(f.is_file() for f in files):
        raise RecordingError(
            f"recording {path}: MCAP file(s) {info.get('relative_file_paths')} missing"
        )
    if (
        use_cache
        and cache.is_file()
        and cache.stat().st_mtime >= max(f.stat().st_mtime for f in files)
    ):
        try:
            return Episode.load(cache)
        except Exception:  # noqa: BLE001 - any reader error of a cut cache: rebuilt from the bag
            cache.unlink(missing_ok=True)

    cameras = _bool(custom.get("cameras", "true"))
    transport, image_size = (
        custom.get("camera_transport", "raw"),
        int(custom.get("image_size") or 0),
    )
    image_topics = tuple(at.camera_topic(rel, transport) for rel in IMAGE_TOPICS)
    required = STATE_TOPICS + (image_topics if cameras else ()) + SPINE_TOPICS
    counts: dict[str, int] = {}
    full_names: dict[str, str] = {}
    for entry in info.get("topics_with_message_count", []):
        name = entry["topic_metadata"]["name"]
        try:
            rel = relative_topic(name)
        except ValueError:
            continue
        full_names[rel] = name
        counts[rel] = counts.get(rel, 0) + int(entry.get("message_count", 0))
    namespace = custom.get("arm_namespace", "")
    for rel in required:
        if counts.get(rel, 0) == 0:
            name = full_names.get(rel) or at.ArmTopics(namespace).name(rel)
            state = "has no messages on" if rel in full_names else "does not contain"
            # No applied command: the arm never ticked under a command (a lockstep arm nobody
            # drove, or a dead adapter).
            why = " (the arm was never driven)" if rel == at.APPLIED_COMMAND_TOPIC else ""
            raise RecordingError(f"recording {path} {state} required topic {name!r}{why}")

    by_topic: dict[str, dict[int, Any]] = {rel: {} for rel in required}
    statuses: dict[int, Any] = {}
    for file in files:
        with open(file, "rb") as f:
            for schema, channel, message in make_reader(f).iter_messages():
                try:
                    rel = relative_topic(channel.topic)
                except ValueError:
                    continue
                if rel not in by_topic:
                    continue
                if rel in image_topics:
                    # Images are decoded only for the steps that are kept (below).
                    stamp = cdr_header_stamp_ns(message.data)
                    by_topic[rel][stamp] = message.data
                    continue
                msg = deserialize_message(message.data, at.message_class(RECORDED_TOPICS[rel]))
                stamp = (
                    at.object_state_stamp_ns(msg)
                    if rel == at.OBJECT_STATE_TOPIC
                    else at.stamp_to_ns(msg.header.stamp)
                )
                if rel == at.EPISODE_STATUS_TOPIC:
                    statuses[stamp] = msg
                by_topic[rel][stamp] = msg

    # The episode is the bridge episode of the last status (the one the recording ended in).
    last_status = statuses[max(statuses)]
    episode_id = int(last_status.episode)
    stamps = sorted(
        s
        for s in by_topic[at.APPLIED_COMMAND_TOPIC]
        if s in statuses and int(statuses[s].episode) == episode_id
    )
    if not stamps:
        raise RecordingError(
            f"recording {path}: no applied command of episode {episode_id} matches an observation"
        )
    obs_topics = [rel for rel in required if rel not in SPINE_TOPICS]
    kept = [s for s in stamps if all(s in by_topic[rel] for rel in obs_topics)]
    dropped = len(stamps) - len(kept)
    if not kept or dropped > max_dropped_fraction * len(stamps):
        missing = {rel: sum(s not in by_topic[rel] for s in stamps) for rel in obs_topics}
        raise RecordingError(
            f"recording {path}: {dropped} of {len(stamps)} steps lack "
            f"observations (missing per topic: {missing})"
        )

    image_type = at.message_class(at.CAMERA_MSGTYPES[transport])
    observations: dict[str, list[np.ndarray]] = {
        k: [] for k in (JOINT_POS, GRIPPER_QPOS, EEF_POS, EEF_QUAT, OBJECT_STATE)
    }
    if cameras:
        observations.update({AGENTVIEW_IMAGE: [], WRIST_IMAGE: []})
    actions = []
    for s in kept:
        command = by_topic[at.APPLIED_COMMAND_TOPIC][s]
        actions.append(applied_action(command))
        observations[JOINT_POS].append(at.decode_joint_state(by_topic[at.JOINT_STATES_TOPIC][s])[0])
        observations[GRIPPER_QPOS].append(
            at.decode_joint_state(by_topic[at.GRIPPER_STATE_TOPIC][s])[0]
        )
        pos, quat = at.decode_pose(by_topic[at.EEF_POSE_TOPIC][s])
        observations[EEF_POS].append(pos)
        observations[EEF_QUAT].append(quat)
        observations[OBJECT_STATE].append(
            at.decode_object_state(by_topic[at.OBJECT_STATE_TOPIC][s])
        )
        if cameras:
            for key, rel in zip((AGENTVIEW_IMAGE, WRIST_IMAGE), image_topics):
                observations[key].append(
                    at.camera_from_msg(
                        deserialize_message(by_topic[rel][s], image_type), transport, image_size
                    )
                )
    if success and not np.any(np.stack(actions)[:, :3]) and len({a[3] for a in actions}) == 1:
        # Hold ticks of an arm nobody drove (a free-running adapter applies a hold per tick).
        raise RecordingError(
            f"recording {path}: the arm never moved: all {len(actions)} applied commands are "
            "holds or zero motion with the gripper unchanged; label it a failure or discard it"
        )
    episode = Episode(
        task=custom.get("task", ""),
        instruction=custom.get("instruction", ""),
        observations={k: np.stack(v) for k, v in observations.items()},
        actions=np.stack(actions).astype(np.float32),
        variation=custom.get("variation", "default"),
        robot_id=custom.get("robot_id", ""),
        success=success,
        metadata={
            "recording": str(path),
            "bridge_episode": str(episode_id),
            "source": custom.get("source", ""),
            "dropped_steps": str(dropped),
            "sim_success": str(bool(last_status.success)),
        },
    )
    if use_cache and success:
        episode.save(cache)
    return episode


def applied_action(command) -> np.ndarray:
    """An applied ArmCommand -> the 4-D action the arm executed."""
    action = np.zeros(ACTION_DIM, dtype=np.float32)
    if int(command.mode) != 3:  # MODE_HOLD records zero motion with the held gripper
        values = np.asarray(command.action, dtype=np.float32)
        if values.shape != (ACTION_DIM - 1,):
            raise RecordingError(
                f"applied command has {values.size} action values, expected {ACTION_DIM - 1}"
            )
        action[:3] = values
    action[3] = float(command.gripper)
    return action


def recording_dirs(directory: str | Path) -> list[Path]:
    """The finished recordings under ``directory``, those in its quarantine left out."""
    directory = Path(directory)
    return [
        meta.parent
        for meta in sorted(directory.rglob(METADATA_FILE))
        if not is_quarantined(meta.parent, directory)
    ]


def recording_succeeded(path: str | Path) -> bool:
    """Whether a finished recording is labelled a success (RecordingError when unfinished)."""
    info = read_recording_metadata(path)
    return _bool((info.get("custom_data") or {}).get("success", "false"))


def load_recorded_episodes(directory: str | Path, *, include_failed: bool = False) -> list[Episode]:
    """Every finished recording under ``directory`` as episodes (failed ones excluded); the first
    that cannot be converted raises (``fed_ros.ros.arm.driving.local_episodes`` skips it)."""
    return [
        recording_to_episode(path, allow_failed=include_failed)
        for path in recording_dirs(directory)
        if include_failed or recording_succeeded(path)
    ]
