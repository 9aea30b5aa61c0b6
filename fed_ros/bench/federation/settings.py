"""Profiles and fleet settings of `fed-ros bench federation`.

A *setting* is a fleet: K robots, each a member of a *family* (task, simulator variation,
action frame) with its share of demonstrations. A *method* (`methods`) is a strategy
with its settings, or "centralized". A *cell* is (setting, method, seed); each finished cell is
one JSON file, so reruns skip it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from fed_ros.bench.federation.methods import (
    ALL_METHODS,
    CORE_METHODS,
    METHODS,
    Method,
    fedepth_method,
    method_by_name,
)
from fed_ros.bench.federation.wire import check_bench_encoding, model_encoding
from fed_ros.learning.backbones.specs import FLEET, SCRATCH
from fed_ros.learning.configuration_fleet_encoder import FleetEncoderConfig
from fed_ros.learning.configuration_policy import PolicyConfig


@dataclass(frozen=True)
class Family:
    """Demonstrations of one (task, variation) as seen by one kind of arm.

    ``mirrored``: the arm is mounted rotated 180 degrees about the vertical axis relative to
    the shared work-cell frame its observations are expressed in, so the same observation
    needs the opposite x/y end-effector command (an embodiment/calibration skew). Its demos
    are the scripted expert's with x/y negated, and closed-loop actions are negated back
    before they reach the simulator, which is exactly what such an arm's controller sees.

    ``cell_offset``: the family works in its own work cell whose origin sits this far (m)
    from the shared frame's, so every absolute position it observes (end effector, objects,
    targets) is shifted by it; relative vectors, joints and actions (deltas) are unchanged.
    Demos and closed-loop observations are shifted the same way by the bench. This is an
    input-distribution skew (what FeDepth's descriptor sees) with no effect on the physics.
    """

    name: str
    task: str = "lift"
    variation: str = "default"
    mirrored: bool = False
    cell_offset: tuple[float, float, float] = (0.0, 0.0, 0.0)

    def __post_init__(self) -> None:
        off = tuple(float(v) for v in self.cell_offset)
        if len(off) != 3 or not all(math.isfinite(v) and abs(v) <= 1.0 for v in off):
            raise ValueError(
                f"family {self.name!r}: cell_offset must be 3 finite metres within "
                f"[-1, 1], got {self.cell_offset!r}"
            )
        object.__setattr__(self, "cell_offset", off)


@dataclass(frozen=True)
class Setting:
    """A fleet: robot n draws its demos from the families in ``robots[n]`` (name -> count)."""

    name: str
    families: tuple[Family, ...]
    robots: tuple[tuple[tuple[str, int], ...], ...]
    num_clusters: int  # C for CUA/IFCA (paper: 1 same-suite, 2 cross-suite)
    description: str = ""
    cameras: bool = False  # demos and rollouts carry the two camera images (image-policy cells)

    def __post_init__(self) -> None:
        names = {f.name for f in self.families}
        if len(names) != len(self.families):
            raise ValueError(f"setting {self.name!r}: duplicate family names")
        for n, mix in enumerate(self.robots):
            for fam, count in mix:
                if fam not in names:
                    raise ValueError(
                        f"setting {self.name!r}: robot {n} uses unknown family {fam!r}"
                    )
                if count < 1:
                    raise ValueError(
                        f"setting {self.name!r}: robot {n} has {count} demos of {fam!r}"
                    )
        if self.num_clusters < 1:
            raise ValueError(f"setting {self.name!r}: num_clusters must be >= 1")

    @property
    def robot_ids(self) -> list[str]:
        """robot_0 .. robot_{K-1}."""
        return [f"robot_{n}" for n in range(len(self.robots))]

    def family(self, name: str) -> Family:
        """Family by name."""
        for f in self.families:
            if f.name == name:
                return f
        raise ValueError(f"setting {self.name!r} has no family {name!r}")

    def dominant_family(self, n: int) -> str:
        """Family robot n has most demos of (its latent group)."""
        return max(self.robots[n], key=lambda fc: fc[1])[0]


@dataclass(frozen=True)
class Profile:
    """Sizes of one benchmark run (quick: minutes on 2 cores; default: <= 1 h; gpu: larger)."""

    name: str
    robots: int = 4
    demos_per_robot: int = 10
    rounds: int = 6
    local_steps: int = 60  # optimiser steps per robot per round
    lr: float = 3e-3
    eval_episodes: int = 5
    eval_every: int = 3  # closed-loop evaluation every this many rounds (and the last)
    # Rollouts end as failures after this multiple of the family's longest demo (None: the
    # task's horizon). Measured in the quick profile: successful Lift rollouts took 40-99
    # steps (expert demos 46-53), failures ran the full 200-step horizon.
    eval_horizon_factor: float | None = None
    seeds: tuple[int, ...] = (0,)
    methods_cross: tuple[str, ...] = ()
    methods_same: tuple[str, ...] = ()
    # FeDepth target overlaps of the overlap sweep. Its 5-robot setting reaches 0, 40, 60
    # and 100 %; 20 % (one bridging robot) cannot occur (fed_ros.core.clustering.fedepth).
    overlaps: tuple[float, ...] = (0.0, 0.4, 1.0)
    # Methods of the covariate-shift overlap variant (`overlap_shift_setting`): method names
    # or fedepth_ovNNN sweep names; None runs the same sweep as `overlap` (``overlaps`` +
    # fedavg + local). The quick and default profiles keep it to hard, the smallest
    # reachable soft target and the two baselines.
    overlap_shift_methods: tuple[str, ...] | None = None
    # The few-demonstrations fleet (issue 23: "with few demonstrations per arm, does joining the
    # fleet help my arm?"): this many robots per family, each with this many demos.
    few_robots_per_family: int = 3
    few_demos_per_robot: int = 4
    few_third_family: str = "cell"  # or "can": PickPlaceCan arms (`few`)
    few_eval_episodes: int = 20  # rollouts per (model, family) and evaluation
    methods_few: tuple[str, ...] = ("local", "fedavg", "feddrman", "centralized")
    rnd_robots_per_group: int = 2
    rnd_demos_per_robot: int = 3
    alphas: tuple[float, ...] = (0.1, 1000.0)
    partition_segments: int = 160  # pool items (episode segments) for the loss-vs-alpha study
    partition_rounds: int = 4
    policy: dict[str, Any] = field(default_factory=dict)
    noise_std: float = 0.05
    # How updates and cluster models travel (fed_ros.core.encodings): the robots start from
    # and are evaluated on the decoded models, the server aggregates the decoded updates.
    # "topk" / "topk:<fraction>": sparse update deltas with error feedback, float32 models;
    # "UPDATE/MODEL" names the two apart (e.g. int4_block/float32).
    encoding: str = "float32"
    # FleetEncoderConfig fields of the shared encoder stage a ``vision_backbone="fleet"``
    # policy needs (`encoder`); None takes the config's defaults.
    fleet_encoder: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        check_bench_encoding(self.encoding)

    @property
    def backbone_suffix(self) -> str:
        """The cell-key suffix of the camera trunk (see :func:`backbone_suffix`)."""
        return backbone_suffix(self.policy, self.fleet_encoder)

    @property
    def model_encoding(self) -> str:
        """How cluster models travel (topk is for updates only: models go as float32)."""
        return model_encoding(self.encoding)

    def policy_config(self) -> PolicyConfig:
        """The benchmark's low-dim policy (small enough for CPU rounds)."""
        base: dict[str, Any] = dict(
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
        base.update(self.policy)
        return PolicyConfig(**base)

    def to_json(self) -> dict[str, Any]:
        """JSON form (recorded in every cell for provenance)."""
        return asdict(self)


PROFILES: dict[str, Profile] = {
    "quick": Profile(
        name="quick",
        robots=4,
        demos_per_robot=8,
        rounds=6,
        local_steps=50,
        eval_episodes=4,
        eval_every=3,
        eval_horizon_factor=2.5,
        seeds=(0,),
        methods_cross=CORE_METHODS,
        methods_same=("local", "fedavg", "feddrman", "ifca"),
        overlaps=(0.0, 0.4, 0.6, 1.0),
        overlap_shift_methods=("fedepth_ov000", "fedepth_ov040", "fedavg", "local"),
        alphas=(0.1, 1000.0),
        partition_segments=96,
        partition_rounds=3,
    ),
    # Sized from measured idle-core costs (training ~10 ms per step, a control step with
    # policy inference ~12.5 ms). Measured: 34 min 20 s wall for three seeds with --jobs 2
    # on 2 idle cores (the quick profile: 8 min 32 s), fresh output directory.
    "default": Profile(
        name="default",
        robots=4,
        demos_per_robot=10,
        rounds=6,
        local_steps=80,
        eval_episodes=6,
        eval_every=3,
        eval_horizon_factor=2.5,
        seeds=(0, 1, 2),
        methods_cross=ALL_METHODS,
        methods_same=("local", "fedavg", "feddrman", "ifca"),
        overlaps=(0.0, 0.4, 0.6, 1.0),
        overlap_shift_methods=("fedepth_ov000", "fedepth_ov040", "fedavg", "local"),
        alphas=(0.1, 10.0, 1000.0),
        partition_segments=192,
        partition_rounds=6,
    ),
    "gpu": Profile(
        name="gpu",
        robots=6,
        demos_per_robot=30,
        rounds=30,
        local_steps=300,
        eval_episodes=20,
        eval_every=5,
        seeds=(0, 1, 2),
        methods_cross=ALL_METHODS,
        methods_same=ALL_METHODS,
        overlaps=(0.0, 0.4, 0.6, 1.0),
        alphas=(0.1, 1.0, 10.0, 1000.0),
        partition_segments=512,
        partition_rounds=20,
        policy={
            "embed_dim": 64,
            "window": 5,
            "transformer_layers": 2,
            "transformer_heads": 4,
            "transformer_ff": 256,
            "text_dim": 256,
        },
    ),
}


def cross_family(profile: Profile) -> Setting:
    """Robots specialised in conflicting families: half normal, half mirrored arms (C=2)."""
    k = max(2, profile.robots)
    fams = (
        Family("lift", "lift", "default", False),
        Family("lift_mirrored", "lift", "default", True),
    )
    robots = tuple(
        ((fams[0 if n < (k + 1) // 2 else 1].name, profile.demos_per_robot),) for n in range(k)
    )
    return Setting(
        "cross_family",
        fams,
        robots,
        num_clusters=2,
        description="half the robots are mirrored-mount arms: same observations, "
        "opposite x/y commands; families genuinely conflict",
    )


def same_family(profile: Profile, seed: int = 0, alpha: float = 0.5) -> Setting:
    """One task family (Lift) over object variations, per-robot mixture ~ Dir(alpha) (C=1)."""
    from fed_ros.core.data.partition import _round_preserving_sum, dirichlet_proportions
    import numpy as np

    variations = ("default", "small_objects", "big_objects")
    fams = tuple(Family(f"lift/{v}", "lift", v, False) for v in variations)
    rng = np.random.default_rng(seed)
    q = dirichlet_proportions(alpha, np.ones(len(fams)), profile.robots, rng)
    robots = []
    for n in range(profile.robots):
        counts = _round_preserving_sum(q[n] * profile.demos_per_robot)
        mix = tuple((f.name, int(c)) for f, c in zip(fams, counts) if c > 0)
        robots.append(mix)
    return Setting(
        "same_family",
        fams,
        tuple(robots),
        num_clusters=1,
        description=f"Lift with object-size variations, Dir(alpha={alpha}) per robot",
    )


# Work cell of the mirrored domain in the overlap setting, relative to the shared frame (m):
# comparable to Lift's cube placement range, so single frames of the two domains overlap
# (a small policy cannot simply read the domain off its input) while a robot's frame
# distribution, which FeDepth's descriptor summarises, clearly shifts.
OVERLAP_CELL_OFFSET = (0.0, 0.06, 0.0)


def overlap_setting(profile: Profile, mirrored: bool = True) -> Setting:
    """FeDepth's overlapping domains: two input-skewed domains and two mixed (bridge) robots.

    Domain A: normal arms; domain B works in a second work cell offset by
    OVERLAP_CELL_OFFSET (so their inputs differ). With ``mirrored`` (setting ``overlap``)
    domain B's arms are mirrored (opposite x/y commands), so the domains also conflict and
    averaging them hurts; without it (setting ``overlap_shift``) B's arms are normal: pure
    covariate shift with one task mapping, FeDepth's paper setting, where sharing helps.
    Robots 0-1 hold A, robot 4 holds B, robot 2 mostly A with some B and robot 3 the
    reverse. The bridges are unequal mixtures on purpose: each bridge is close to its own
    side and to the other bridge, so soft clustering gives two clusters that share both
    bridges (overlap 2/5); equal mixtures would be equidistant from both sides, and their
    neighbourhoods would merge everything (fed_ros.core.clustering.fedepth: a cluster pair cannot
    share one client).
    """
    b_name = "lift_mirrored_cell" if mirrored else "lift_cell"
    fams = (
        Family("lift", "lift", "default", False),
        Family(b_name, "lift", "default", mirrored, OVERLAP_CELL_OFFSET),
    )
    d = profile.demos_per_robot
    minor = max(1, d // 4)
    a, b = fams[0].name, fams[1].name
    robots = (
        ((a, d),),
        ((a, d),),
        ((a, d - minor), (b, minor)),
        ((a, minor), (b, d - minor)),
        ((b, d),),
    )
    arms = "mirrored arms" if mirrored else "normal arms (same task mapping)"
    return Setting(
        "overlap" if mirrored else "overlap_shift",
        fams,
        robots,
        num_clusters=2,
        description=f"domain A (normal arms) and domain B ({arms} in a work cell "
        f"offset by {OVERLAP_CELL_OFFSET} m); robots 2 and 3 hold unequal "
        "mixtures of both",
    )


def overlap_shift_setting(profile: Profile) -> Setting:
    """The covariate-shift overlap variant: as `overlap_setting` but domain B not mirrored."""
    return overlap_setting(profile, mirrored=False)


def overlap_methods(profile: Profile, setting: Setting) -> list[Method]:
    """Methods run on an overlap variant: the FeDepth sweep + fedavg + local, except that
    ``overlap_shift`` runs ``profile.overlap_shift_methods`` when the profile sets it."""
    if setting.name == "overlap_shift" and profile.overlap_shift_methods is not None:
        return [method_by_name(n) for n in profile.overlap_shift_methods]
    return [fedepth_method(o) for o in profile.overlaps] + [METHODS["fedavg"], METHODS["local"]]


def rnd_setting(profile: Profile) -> Setting:
    """Clustered feature skew for RND: robot groups in different work cells (task scenes)."""
    fams = (
        Family("lift", "lift"),
        Family("stack", "stack"),
        Family("pick_place_can", "pick_place_can"),
    )
    per = profile.rnd_robots_per_group
    robots = tuple(((f.name, profile.rnd_demos_per_robot),) for f in fams for _ in range(per))
    return Setting(
        "rnd_feature_skew",
        fams,
        robots,
        num_clusters=len(fams),
        description="robots in three work cells (lift / stack / can scenes)",
    )


def with_overrides(profile: Profile, **changes: Any) -> Profile:
    """Profile copy with CLI overrides (None values ignored)."""
    return replace(profile, **{k: v for k, v in changes.items() if v is not None})


def fmt_alpha(a: float) -> str:
    """Alpha for file names and tables."""
    return "inf" if math.isinf(a) else f"{a:g}"


def backbone_suffix(policy: dict[str, Any], fleet_encoder: dict[str, Any] | None) -> str:
    """``""`` for the scratch trunk, else ``__<backbone>``; the fleet encoder's objective is
    named when it is not the default (``__fleet_temporal``), so cells of two objectives never
    resume as each other."""
    backbone = policy.get("vision_backbone", SCRATCH)
    if backbone == SCRATCH:
        return ""
    objective = (fleet_encoder or {}).get("objective", FleetEncoderConfig.objective)
    if backbone == FLEET and objective != FleetEncoderConfig.objective:
        return f"__{backbone}_{objective}"
    return f"__{backbone}"
