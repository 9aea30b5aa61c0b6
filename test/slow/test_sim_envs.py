"""ArmEnv: observation contract, upright images, seeding, action validation, variations."""

from __future__ import annotations

import mujoco
import numpy as np
import pytest

from fed_ros.core.data.episode import (
    ACTION_DIM,
    AGENTVIEW_IMAGE,
    EEF_POS,
    EEF_QUAT,
    GRIPPER_QPOS,
    IMAGE_KEYS,
    JOINT_POS,
    LOWDIM_KEYS,
    OBJECT_STATE,
    OBJECT_STATE_DIM,
)
from fed_ros.sim.envs import AGENTVIEW_CAMERA, TASKS, WRIST_CAMERA, ArmEnv, make_env
from fed_ros.sim.variations import VARIATIONS, Variation, random_variation, resolve_variation

pytestmark = pytest.mark.sim
SIZE = 64


@pytest.fixture(scope="module")
def cam_env():
    with make_env("lift", cameras=True, image_size=SIZE, seed=0) as env:
        yield env


@pytest.fixture(scope="module")
def blind_env():
    with make_env("lift", cameras=False, seed=0) as env:
        yield env


def test_observation_keys_shapes_and_dtypes(cam_env: ArmEnv) -> None:
    obs = cam_env.reset(seed=1)
    assert set(obs) == set(IMAGE_KEYS) | set(LOWDIM_KEYS)
    for key in IMAGE_KEYS:
        assert obs[key].shape == (SIZE, SIZE, 3) and obs[key].dtype == np.uint8
    shapes = {
        JOINT_POS: (7,),
        GRIPPER_QPOS: (2,),
        EEF_POS: (3,),
        EEF_QUAT: (4,),
        OBJECT_STATE: (OBJECT_STATE_DIM,),
    }
    for key, shape in shapes.items():
        assert obs[key].shape == shape and obs[key].dtype == np.float32, key
    assert np.isclose(np.linalg.norm(obs[EEF_QUAT]), 1.0, atol=1e-5)
    assert len(cam_env.joint_names) == 7 and cam_env.control_hz == 20 and cam_env.horizon > 0
    assert cam_env.instruction == "lift the red cube"


def test_eef_and_object_positions_are_in_the_base_frame(blind_env: ArmEnv) -> None:
    obs = blind_env.reset(seed=2)
    d = blind_env.raw_env.sim.data
    base = d.get_body_xpos("robot0_base")
    cube_world = blind_env.object_positions()["cube"]
    # The Panda base is not rotated in robosuite, so the base frame is a pure translation.
    np.testing.assert_allclose(obs[OBJECT_STATE][:3], cube_world - base, atol=1e-5)
    np.testing.assert_allclose(
        obs[OBJECT_STATE][7:10], obs[OBJECT_STATE][:3] - obs[EEF_POS], atol=1e-5
    )
    assert np.all(obs[OBJECT_STATE][10:] == 0)  # zero padding


def _place_at_pixel(env: ArmEnv, camera: str, u: float, v: float, depth: float) -> None:
    """Teleport the cube so a correct (upright, unmirrored) camera sees it at pixel (u, v)."""
    m, d = env.raw_env.sim.model._model, env.raw_env.sim.data._data
    cam = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_CAMERA, camera)
    f = (SIZE / 2) / np.tan(np.deg2rad(m.cam_fovy[cam]) / 2)
    # MuJoCo cameras look along -z with +y up in their own frame.
    local = np.array([(u - SIZE / 2) / f * depth, (SIZE / 2 - v) / f * depth, -depth])
    world = d.cam_xpos[cam] + d.cam_xmat[cam].reshape(3, 3) @ local
    env.raw_env.sim.data.set_joint_qpos(env.raw_env.cube.joints[0], np.r_[world, 1, 0, 0, 0])
    mujoco.mj_forward(m, d)


@pytest.mark.parametrize("camera,depth", [(AGENTVIEW_CAMERA, 0.7), (WRIST_CAMERA, 0.25)])
def test_images_are_upright_and_not_mirrored(camera: str, depth: float) -> None:
    # A pure-blue cube placed where an upright camera would show it in the upper-left
    # quadrant; a flipped image would show it lower, a mirrored one to the right.
    blue = Variation(name="blue", object_colors=("blue",), light_ambient=0.6)
    with make_env("lift", blue, cameras=True, image_size=SIZE, seed=0) as env:
        env.reset(seed=0)
        u, v = 0.3 * SIZE, 0.25 * SIZE
        _place_at_pixel(env, camera, u, v, depth)
        img = env.render(camera).astype(int)
    mask = (img[..., 2] > 90) & (img[..., 2] > img[..., 0] + 50) & (img[..., 2] > img[..., 1] + 40)
    assert mask.sum() >= 4, f"cube not visible in {camera}"
    rows, cols = np.nonzero(mask)
    assert abs(rows.mean() - v) < 0.1 * SIZE, (rows.mean(), v)
    assert abs(cols.mean() - u) < 0.1 * SIZE, (cols.mean(), u)


def test_agentview_shows_table_below_robot(cam_env: ArmEnv) -> None:
    # Coarse scene check: the bright table top fills the bottom rows, the robot/wall the top.
    img = cam_env.reset(seed=0)[AGENTVIEW_IMAGE].astype(float).mean(axis=2)
    assert img[-SIZE // 4 :].mean() > img[: SIZE // 8].mean() + 30


def test_same_seed_gives_identical_observations(cam_env: ArmEnv) -> None:
    first = cam_env.reset(seed=11)
    a = [cam_env.step(np.array([0.3, -0.2, 0.1, 1.0]))[0] for _ in range(3)]
    second = cam_env.reset(seed=11)
    b = [cam_env.step(np.array([0.3, -0.2, 0.1, 1.0]))[0] for _ in range(3)]
    for x, y in zip([first, *a], [second, *b]):
        for key in x:
            np.testing.assert_array_equal(x[key], y[key], err_msg=key)
    other = cam_env.reset(seed=12)
    assert not np.array_equal(other[OBJECT_STATE], first[OBJECT_STATE])


@pytest.mark.parametrize(
    "bad",
    [
        np.zeros(3),
        np.zeros(5),
        np.zeros((1, 4)),
        [0, 0, np.nan, 0],
        [0, np.inf, 0, 0],
        "left",
        None,
    ],
)
def test_bad_actions_raise_value_error(blind_env: ArmEnv, bad) -> None:
    blind_env.reset(seed=0)
    with pytest.raises(ValueError):
        blind_env.step(bad)
    assert blind_env.steps == 0


def test_out_of_range_actions_are_clipped() -> None:
    np.testing.assert_array_equal(ArmEnv.check_action([2.0, -3.0, 0.5, 1.5]), [1.0, -1.0, 0.5, 1.0])
    assert ArmEnv.check_action(np.zeros(ACTION_DIM)).shape == (ACTION_DIM,)


def test_bad_constructor_arguments_raise() -> None:
    with pytest.raises(ValueError, match="unknown task"):
        make_env("juggle", cameras=False)
    with pytest.raises(ValueError, match="unknown variation"):
        make_env("lift", "disco", cameras=False)
    with pytest.raises(ValueError, match="image_size"):
        make_env("lift", image_size=3)


def test_horizon_ends_the_episode() -> None:
    with make_env("lift", cameras=False, horizon=5) as env:
        env.reset(seed=0)
        dones = [env.step(np.zeros(4))[1] for _ in range(5)]
    assert dones == [False] * 4 + [True]


# ------------------------------------------------------------------ variations
def _model(env: ArmEnv):
    return env.raw_env.sim.model._model


def test_variation_edits_what_it_claims(blind_env: ArmEnv) -> None:
    m = _model(blind_env)
    cam = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_CAMERA, AGENTVIEW_CAMERA)
    table = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_GEOM, "table_visual")
    cube_geoms = [
        mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_GEOM, n) for n in ("cube_g0", "cube_g0_vis")
    ]
    blind_env.set_variation("default")
    cam_pos, cam_quat = m.cam_pos[cam].copy(), m.cam_quat[cam].copy()
    diffuse = m.light_diffuse.copy()
    sizes = m.geom_size[cube_geoms].copy()
    mass = m.body_mass[m.geom_bodyid[cube_geoms[0]]]

    blind_env.set_variation(
        Variation(
            name="t",
            camera_pos_offset=(0.1, 0.0, -0.05),
            camera_rot_offset=(0, 5, 0),
            light_scale=0.5,
            table_rgba=(0.2, 0.3, 0.4, 1.0),
            object_colors=("green",),
            object_scale=1.1,
        )
    )
    np.testing.assert_allclose(m.cam_pos[cam], cam_pos + [0.1, 0.0, -0.05])
    assert not np.allclose(m.cam_quat[cam], cam_quat)
    np.testing.assert_allclose(m.light_diffuse, diffuse * 0.5, rtol=1e-6)
    assert m.geom_matid[table] == -1
    np.testing.assert_allclose(m.geom_rgba[table], [0.2, 0.3, 0.4, 1.0])
    np.testing.assert_allclose(m.geom_rgba[cube_geoms[1]], [0.10, 0.70, 0.15, 1.0], atol=1e-6)
    np.testing.assert_allclose(m.geom_size[cube_geoms], sizes * 1.1, rtol=1e-6)
    assert np.isclose(m.body_mass[m.geom_bodyid[cube_geoms[0]]], mass * 1.1**3)
    assert blind_env.instruction == "lift the green cube"

    # Switching back restores every original value (edits start from saved originals).
    blind_env.set_variation("default")
    np.testing.assert_allclose(m.cam_pos[cam], cam_pos)
    np.testing.assert_allclose(m.light_diffuse, diffuse)
    np.testing.assert_allclose(m.geom_size[cube_geoms], sizes)


@pytest.mark.parametrize("scale", [0.8, 1.15])
def test_scaled_objects_rest_on_the_table(scale: float) -> None:
    with make_env("lift", Variation(name="s", object_scale=scale), cameras=False) as env:
        env.reset(seed=3)
        for _ in range(10):
            obs = env.step(np.zeros(4))[0]
        m = _model(env)
        half = m.geom_size[mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_GEOM, "cube_g0")][2]
        table_top = env.raw_env.model.mujoco_arena.table_offset[2]
        cube_z = env.object_positions()["cube"][2]
    assert abs(cube_z - (table_top + half)) < 2e-3, (cube_z, table_top, half)
    assert np.isfinite(obs[OBJECT_STATE]).all()


def test_variations_change_the_rendered_image(cam_env: ArmEnv) -> None:
    images = {}
    for name in ("default", "dim_light", "red_table", "shifted_camera", "big_objects"):
        cam_env.set_variation(name)
        images[name] = cam_env.reset(seed=4)[AGENTVIEW_IMAGE].astype(int)
    cam_env.set_variation("default")
    base = images.pop("default")
    for name, img in images.items():
        assert np.abs(img - base).mean() > 0.5, name
    assert images["dim_light"].mean() < base.mean() - 20
    red = images["red_table"][-SIZE // 4 :]
    assert red[..., 0].mean() > red[..., 1].mean() + 60


def test_random_variation_is_reproducible_by_seed() -> None:
    assert random_variation(5) == random_variation(5)
    assert random_variation(5) != random_variation(6)
    assert resolve_variation("random:5") == random_variation(5)
    with (
        make_env("stack", "random:5", cameras=False) as a,
        make_env("stack", "random:5", cameras=False) as b,
    ):
        ma, mb = _model(a), _model(b)
        for field in (
            "cam_pos",
            "cam_quat",
            "light_diffuse",
            "geom_rgba",
            "geom_size",
            "geom_matid",
            "body_mass",
        ):
            np.testing.assert_array_equal(getattr(ma, field), getattr(mb, field), err_msg=field)
        np.testing.assert_array_equal(a.reset(seed=9)[OBJECT_STATE], b.reset(seed=9)[OBJECT_STATE])


@pytest.mark.parametrize(
    "kwargs",
    [
        {"object_scale": 3.0},
        {"light_scale": float("nan")},
        {"camera_pos_offset": (0, 0)},
        {"table_rgba": (1, 0, 0, 2)},
        {"object_colors": ("mauve",)},
        {"table_material": "gold"},
        {"name": ""},
    ],
)
def test_invalid_variation_raises(kwargs) -> None:
    with pytest.raises(ValueError):
        Variation(**kwargs)


def test_presets_are_valid_and_named() -> None:
    assert "default" in VARIATIONS and len(VARIATIONS) >= 5
    assert all(name == v.name for name, v in VARIATIONS.items())
    assert set(TASKS) == {"lift", "pick_place_can", "stack"}


def test_variation_round_trips_through_a_dict() -> None:
    v = random_variation(8)
    assert Variation.from_dict(v.to_dict()) == v
    assert resolve_variation({"name": "x", "object_scale": 0.9}).object_scale == 0.9
    with pytest.raises(ValueError, match="unknown Variation fields"):
        Variation.from_dict({"name": "x", "gravity": 3})


def test_variation_from_untrusted_dicts_only_raises_value_error() -> None:
    # Variations arrive from ROS requests and fleet configs: anything malformed must be a
    # ValueError (never TypeError/KeyError), anything accepted must be fully valid.
    from hypothesis import given, settings
    from hypothesis import strategies as st

    scalar = st.one_of(
        st.none(), st.booleans(), st.integers(-5, 5), st.floats(allow_nan=True), st.text(max_size=8)
    )
    value = st.one_of(scalar, st.lists(scalar, max_size=5), st.tuples(scalar, scalar, scalar))
    keys = st.sampled_from(
        [
            "name",
            "camera_pos_offset",
            "camera_rot_offset",
            "light_scale",
            "light_tint",
            "light_ambient",
            "light_pos_offset",
            "table_material",
            "table_rgba",
            "object_colors",
            "object_scale",
            "background_rgba",
            "bogus",
        ]
    )

    @settings(max_examples=300, deadline=None)
    @given(st.dictionaries(keys, value, max_size=4))
    def check(data: dict) -> None:
        try:
            v = resolve_variation(data)
        except ValueError:
            return
        assert Variation.from_dict(v.to_dict()) == v

    check()


def test_renders_headless_even_if_mujoco_was_imported_first(tmp_path) -> None:
    # Users (and ROS nodes) may import mujoco before fed_ros.sim without setting MUJOCO_GL.
    import os
    import subprocess
    import sys

    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("MUJOCO_GL", "PYOPENGL_PLATFORM", "DISPLAY")
    }
    code = (
        "import mujoco\n"
        "from fed_ros.sim.envs import make_env\n"
        "with make_env('lift', cameras=True, image_size=24) as e:\n"
        "    img = e.reset(seed=0)['agentview_image']\n"
        "    assert img.shape == (24, 24, 3) and img.std() > 5\n"
        "print('ok')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-2000:]


def test_object_material_textures_uncoloured_objects_and_instruction_follows() -> None:
    v = Variation(name="tex", object_colors=("blue",), object_material="floor")
    with make_env("stack", v, cameras=False) as env:
        m = _model(env)
        floor = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_MATERIAL, "floorplane")
        a_vis = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_GEOM, "cubeA_g0_vis")
        b_vis = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_GEOM, "cubeB_g0_vis")
        assert m.geom_matid[a_vis] == -1 and m.geom_matid[b_vis] == floor
        assert env.instruction == "stack the blue cube on the brown cube"
        env.set_variation("metal_objects")
        assert env.instruction == "stack the grey cube on the grey cube"
        env.set_variation("default")
        assert env.instruction == "stack the red cube on the green cube"
        assert m.geom_matid[b_vis] != floor
