"""Pure conversions between numpy / state dicts and fed_ros messages (one import for callers).

The conversions live in two modules by what they convert:

    fed_ros.ros.wire.tensors     state dicts <-> payload bytes, manifests, chunks
    fed_ros.ros.wire.round_msgs  update / cluster-model messages, descriptors, announcements

Nothing here starts a node; both are unit-tested without ROS processes.
"""
from __future__ import annotations

from fed_ros.ros.wire.round_msgs import (  # noqa: F401 - re-exported
    DESCRIPTOR_KIND_NAMES, DESCRIPTOR_KINDS, STAGE_NAMES, STAGES, Announcement, announcement_from_msg,
    announcement_to_msg, cluster_model_msg, descriptor_from_msg, descriptor_to_msg, model_update_msg,
    round_config_from_msg, round_config_to_msg)
from fed_ros.ros.wire.tensors import (  # noqa: F401 - re-exported
    ENCODING_NAMES, ENCODINGS, MODEL_DTYPES, EncodedPayload, StateDict, bytes_view, chunk_ranges,
    decode_state_dict, encode_state_dict, encoded_size, manifest_from_msgs, manifest_to_msgs, payload_chunk,
    payload_header, set_bytes_field, set_float32_field, sha256_hex)
