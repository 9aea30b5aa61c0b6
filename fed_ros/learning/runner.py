"""Closed-loop policy execution: what evaluation and the robot node call every control step."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from fed_ros.core.data.episode import ACTION_DIM
from fed_ros.learning.configuration_policy import PolicyConfig
from fed_ros.learning.device import resolve_device
from fed_ros.learning.modeling_policy import build_policy
from fed_ros.learning.text import encode_instruction
from fed_ros.learning.weights import StateDict, load_state_dict_into


class PolicyRunner:
    """Wrap a StateDict as an acting policy with an observation-history window.

    ``act(obs)`` takes one step's observations (keys of ``fed_ros.core.data.episode``; images
    HxWx3 uint8 upright) plus optionally ``"instruction"`` (str); otherwise the instruction
    given to the constructor (or :meth:`set_instruction`) is used.
    """

    def __init__(
        self,
        state_dict: StateDict,
        policy_cfg: PolicyConfig,
        device: str = "auto",
        instruction: str | None = None,
        sample: bool = False,
        seed: int = 0,
    ) -> None:
        self.cfg = policy_cfg
        self.device = resolve_device(device)
        self.model = load_state_dict_into(build_policy(policy_cfg, seed=0), state_dict)
        self.model.to(self.device).eval()
        self.sample = sample
        self._generator = torch.Generator(device=self.device)
        self._generator.manual_seed(seed)
        self._text: np.ndarray | None = None
        if instruction is not None:
            self.set_instruction(instruction)

    def set_instruction(self, instruction: str) -> None:
        """Set the language instruction used when obs carries none."""
        self._text = encode_instruction(instruction, self.cfg.text_dim)

    def reset(self) -> None:
        """Start a new episode (clears the history window)."""
        self.model.reset()

    def act(self, obs: dict[str, Any]) -> np.ndarray:
        """Action (ACTION_DIM,) float32 in [-1, 1] for the current observation."""
        step = dict(obs)
        if "instruction" in step:
            step["text"] = encode_instruction(str(step.pop("instruction")), self.cfg.text_dim)
        elif "text" not in step:
            if self._text is None:
                raise ValueError("no instruction: pass obs['instruction'] or set one on the runner")
            step["text"] = self._text
        action = self.model.select_action(step, sample=self.sample, generator=self._generator)
        assert action.shape == (ACTION_DIM,)
        return action

    __call__ = act
