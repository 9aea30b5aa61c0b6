"""The partition study trains as the fleet does (RobotClient + FedAvgStrategy through
`federation_round`) and keeps its own seeds: one round equals the study's former hand-written
FedAvg of `train_local` updates up to float32 rounding (the strategy averages in float32)."""

from __future__ import annotations

import types

import numpy as np

from fed_ros.bench.federation.partition import _segments, fedavg_on_split, partition_seed
from fed_ros.core.params import flatten
from fed_ros.learning.configuration_policy import PolicyConfig
from fed_ros.learning.dataset import synthetic_episodes
from fed_ros.learning.configuration_trainer import TrainerConfig
from fed_ros.learning.trainer import initial_state_dict, train_local

CFG = PolicyConfig(
    kind="lowdim",
    embed_dim=32,
    window=2,
    transformer_layers=1,
    transformer_heads=2,
    transformer_ff=64,
    dropout=0.0,
    text_dim=64,
    num_modes=5,
)


def test_one_partition_round_is_the_seeded_fedavg_of_the_robots_with_data(torch_one_thread):
    segs = _segments(synthetic_episodes(4, 24, seed=0, shift=1.0), 8)
    prof = types.SimpleNamespace(lr=3e-3, local_steps=3, partition_rounds=1)
    seed = 7
    theta0 = initial_state_dict(CFG, seed=seed, episodes=segs)
    split = [segs[:5], [], segs[5:]]  # robot 1 has no data: it sits out
    got = fedavg_on_split(theta0, split, CFG, prof, seed)
    ups, counts = [], []
    for n, robot_segs in enumerate(split):
        if robot_segs:
            tc = TrainerConfig(
                lr=prof.lr,
                max_steps=prof.local_steps,
                epochs=10_000,
                device="cpu",
                progress=False,
                val_fraction=0.0,
                use_sub=False,
                use_act=False,
                seed=partition_seed(seed, 0, n),
            )
            res = train_local(theta0, robot_segs, CFG, tc, val_episodes=[])
            ups.append(flatten(res.params))
            counts.append(res.num_samples)
    w = np.asarray(counts, np.float64) / sum(counts)
    expected = (np.stack(ups) * w[:, None]).sum(0)
    np.testing.assert_allclose(flatten(got), expected, rtol=1e-5, atol=1e-6)
    assert partition_seed(seed, 2, 1) == seed + 97 * 2 + 1
