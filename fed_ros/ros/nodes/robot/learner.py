"""The robot's learner, built from its parameters: the policy configuration, the RobotClient
that trains and evaluates it, and the manifest every cluster model must match.

Built once at start-up; a bad or forbidden training setting raises ValueError here, so the
node refuses to start with the parameter named instead of failing in the first round.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RobotLearner:
    policy_cfg: Any  # fed_ros.learning.configuration_policy.PolicyConfig
    client: Any  # fed_ros.learning.client.RobotClient
    manifest: Any  # fed_ros.core.params.Manifest: what cluster models must match


def make_learner(params, backbone_weights: str | None = None) -> RobotLearner:
    """From RobotParams: torch threads set, the policy config, the client, the manifest
    (``backbone_weights``: the file the robot keeps the server's fleet encoder in).

    A pretrained backbone's weights are read here: a missing file raises the backbones'
    FileNotFoundError (the path and how to get the file) before the node starts.
    """
    if params.torch_threads:
        import torch

        torch.set_num_threads(params.torch_threads)
    from fed_ros.core.params import manifest_of
    from fed_ros.learning.client import RobotClient
    from fed_ros.learning.configuration_policy import PolicyConfig
    from fed_ros.learning.trainer import initial_state_dict
    from fed_ros.ros.configuration.fleet_params import policy_architecture

    policy_cfg = PolicyConfig(
        **policy_architecture(params, backbone_weights),
        use_object_state=None if params.use_object_state else False,
    )
    # The robot's own training settings; the round config overrides what it decides.
    client = RobotClient(
        params.robot_id,
        policy_cfg,
        robot_seed=params.seed,
        device=params.device,
        local=params.local_training(),
    )  # ValueError at start on a bad or forbidden setting
    return RobotLearner(policy_cfg, client, manifest_of(initial_state_dict(policy_cfg)))
