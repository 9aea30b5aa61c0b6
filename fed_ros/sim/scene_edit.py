"""Applying a :class:`~fed_ros.sim.variations.Variation` to a compiled robosuite scene (MuJoCo).

:class:`SceneEditor` finds a task's objects, saves the compiled model's originals once
(agent-view camera pose, lights, colours and materials, sizes, masses, mesh vertices and
bounding volumes, the objects' Python-side sizes robosuite places them with), and
:meth:`SceneEditor.apply` edits the model to match a variation, always starting from those
originals: idempotent, no XML is regenerated, and soft resets keep it.
:class:`fed_ros.sim.envs.ArmEnv` owns one per environment (and rebuilds its renderer after each
change).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fed_ros.sim.variations import PALETTE, TABLE_MATERIALS, Variation


class SceneEditor:
    """Edits one robosuite environment's compiled MuJoCo model.

    ``objects`` are the task's robosuite objects and ``object_bodies`` their root body ids;
    ``camera`` is the camera whose pose a variation moves (the wrist camera is rigidly mounted).
    """

    def __init__(self, env: Any, task: str, camera: str) -> None:
        self._env = env
        self.task = task
        self._camera = camera
        self._model = env.sim.model._model  # raw mujoco.MjModel
        self._data = env.sim.data._data
        self.objects = self._task_objects()
        self.object_bodies = [env.sim.model.body_name2id(o.root_body) for o in self.objects]
        self._originals = self._save_originals()

    def _task_objects(self) -> list:
        env = self._env
        if self.task == "lift":
            return [env.cube]
        if self.task == "stack":
            return [env.cubeA, env.cubeB]
        return [o for o in env.objects if o.name.lower().startswith("can")]

    def _geoms_of(self, body_ids: list[int]) -> list[int]:
        m = self._model
        subtree = set()
        for root in body_ids:
            subtree |= {b for b in range(m.nbody) if self._is_descendant(b, root)}
        return [g for g in range(m.ngeom) if int(m.geom_bodyid[g]) in subtree]

    def _is_descendant(self, body: int, root: int) -> bool:
        m = self._model
        while body != 0:
            if body == root:
                return True
            body = int(m.body_parentid[body])
        return root == 0

    def _table_geoms(self) -> list[int]:
        """Visual geoms of the work surface: the table top, or the bins in PickPlace."""
        m = self._model
        names = [m.geom(g).name for g in range(m.ngeom)]
        if "table_visual" in names:
            return [names.index("table_visual")]
        bins = {b for b in range(m.nbody) if m.body(b).name in ("bin1", "bin2")}
        return [
            g
            for g in range(m.ngeom)
            if int(m.geom_bodyid[g]) in bins and m.geom_group[g] == 1 and "leg" not in names[g]
        ]

    def _save_originals(self) -> dict[str, Any]:
        import mujoco

        m = self._model
        name2id = lambda kind, name: mujoco.mj_name2id(m, kind, name)  # noqa: E731
        obj_bodies = []
        for root in self.object_bodies:
            obj_bodies.append(sorted(b for b in range(m.nbody) if self._is_descendant(b, root)))
        obj_geoms = [self._geoms_of([root]) for root in self.object_bodies]
        all_bodies = sorted({b for bs in obj_bodies for b in bs})
        all_geoms = sorted({g for gs in obj_geoms for g in gs})
        meshes = sorted(
            {
                int(m.geom_dataid[g])
                for g in all_geoms
                if m.geom_type[g] == mujoco.mjtGeom.mjGEOM_MESH and m.geom_dataid[g] >= 0
            }
        )
        mesh_verts = {
            k: m.mesh_vert[m.mesh_vertadr[k] : m.mesh_vertadr[k] + m.mesh_vertnum[k]].copy()
            for k in meshes
        }
        mesh_bvh = {
            k: m.bvh_aabb[m.mesh_bvhadr[k] : m.mesh_bvhadr[k] + m.mesh_bvhnum[k]].copy()
            for k in meshes
            if m.mesh_bvhadr[k] >= 0
        }
        body_bvh = {
            b: m.bvh_aabb[m.body_bvhadr[b] : m.body_bvhadr[b] + m.body_bvhnum[b]].copy()
            for b in all_bodies
            if m.body_bvhadr[b] >= 0
        }
        sites = [s for s in range(m.nsite) if int(m.site_bodyid[s]) in set(all_bodies)]
        background = [
            g
            for g in range(m.ngeom)
            if m.geom(g).name == "floor"
            or (m.geom(g).name.startswith("wall") and m.geom(g).name.endswith("visual"))
        ]
        # Python-side object sizes feed robosuite's placement sampler (bottom offset, radius).
        py_sizes: list[tuple[str, Any]] = []
        for obj in self.objects:
            if (
                hasattr(obj, "size")
                and getattr(obj, "size", None) is not None
                and not hasattr(obj, "file")
            ):
                py_sizes.append(("size", np.array(obj.size, dtype=float)))
            else:
                site_pos = {}
                for el in obj.worldbody.iter("site"):
                    if el.get("pos") is not None:
                        site_pos[el] = el.get("pos")
                py_sizes.append(("sites", site_pos))
        return {
            "cam": {
                c: (
                    m.cam_pos[name2id(mujoco.mjtObj.mjOBJ_CAMERA, c)].copy(),
                    m.cam_quat[name2id(mujoco.mjtObj.mjOBJ_CAMERA, c)].copy(),
                )
                for c in (self._camera,)
            },
            "light": (
                m.light_diffuse.copy(),
                m.light_specular.copy(),
                m.light_ambient.copy(),
                m.light_pos.copy(),
            ),
            "headlight": (
                np.array(m.vis.headlight.diffuse),
                np.array(m.vis.headlight.ambient),
                np.array(m.vis.headlight.specular),
            ),
            "table": self._table_geoms(),
            "geom_matid": m.geom_matid.copy(),
            "geom_rgba": m.geom_rgba.copy(),
            "geom_size": m.geom_size.copy(),
            "geom_pos": m.geom_pos.copy(),
            "geom_rbound": m.geom_rbound.copy(),
            "geom_aabb": m.geom_aabb.copy(),
            "body_pos": m.body_pos.copy(),
            "body_mass": m.body_mass.copy(),
            "body_inertia": m.body_inertia.copy(),
            "site_pos": m.site_pos.copy(),
            "obj_bodies": obj_bodies,
            "obj_geoms": obj_geoms,
            "all_geoms": all_geoms,
            "mesh_verts": mesh_verts,
            "mesh_bvh": mesh_bvh,
            "body_bvh": body_bvh,
            "sites": sites,
            "background": background,
            "py_sizes": py_sizes,
        }

    def apply(self, v: Variation) -> None:
        """Edit the compiled model to match ``v``, always starting from the saved originals."""
        import mujoco
        from scipy.spatial.transform import Rotation

        m, o = self._model, self._originals
        # Camera pose (agent view only: the wrist camera is rigidly mounted on the hand).
        for cam, (pos, quat) in o["cam"].items():
            cid = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_CAMERA, cam)
            m.cam_pos[cid] = pos + np.asarray(v.camera_pos_offset)
            base = Rotation.from_quat(np.asarray(quat)[[1, 2, 3, 0]])  # MuJoCo wxyz -> scipy xyzw
            delta = Rotation.from_euler("xyz", v.camera_rot_offset, degrees=True)
            x, y, z, w = (base * delta).as_quat()
            m.cam_quat[cid] = (w, x, y, z)
        # Lighting.
        diffuse, specular, ambient, light_pos = o["light"]
        tint = np.asarray(v.light_tint)
        m.light_diffuse[:] = diffuse * v.light_scale * tint
        m.light_specular[:] = specular * v.light_scale
        m.light_ambient[:] = ambient if v.light_ambient is None else v.light_ambient
        m.light_pos[:] = light_pos + np.asarray(v.light_pos_offset)
        hd, ha, hs = o["headlight"]
        m.vis.headlight.diffuse = hd * v.light_scale * tint
        m.vis.headlight.specular = hs * v.light_scale
        m.vis.headlight.ambient = ha if v.light_ambient is None else np.full(3, v.light_ambient)
        # Colours and textures (a geom with a material shows the material, so clear it).
        m.geom_matid[:] = o["geom_matid"]
        m.geom_rgba[:] = o["geom_rgba"]
        for table in o["table"]:
            if v.table_rgba is not None:
                m.geom_matid[table] = -1
                m.geom_rgba[table] = v.table_rgba
            elif v.table_material is not None:
                m.geom_matid[table] = mujoco.mj_name2id(
                    m, mujoco.mjtObj.mjOBJ_MATERIAL, TABLE_MATERIALS[v.table_material]
                )
        if v.background_rgba is not None:
            for g in o["background"]:
                m.geom_matid[g] = -1
                m.geom_rgba[g] = v.background_rgba
        material = (
            -1
            if v.object_material is None
            else mujoco.mj_name2id(
                m, mujoco.mjtObj.mjOBJ_MATERIAL, TABLE_MATERIALS[v.object_material]
            )
        )
        for i, geoms in enumerate(o["obj_geoms"]):
            colour = v.object_colors[i] if i < len(v.object_colors) else None
            for g in geoms:
                if m.geom_group[g] != 1:  # collision geoms are never drawn
                    continue
                if colour is not None:
                    m.geom_matid[g] = -1
                    m.geom_rgba[g] = PALETTE[colour]
                elif material >= 0:
                    m.geom_matid[g] = material
                    m.geom_rgba[g] = (1.0, 1.0, 1.0, 1.0)
        self._apply_scale(v.object_scale)
        mujoco.mj_forward(m, self._data)

    def _apply_scale(self, s: float) -> None:
        m, o = self._model, self._originals
        m.geom_size[:] = o["geom_size"]
        m.geom_pos[:] = o["geom_pos"]
        m.geom_rbound[:] = o["geom_rbound"]
        m.geom_aabb[:] = o["geom_aabb"]
        m.body_pos[:] = o["body_pos"]
        m.body_mass[:] = o["body_mass"]
        m.body_inertia[:] = o["body_inertia"]
        m.site_pos[:] = o["site_pos"]
        for k, verts in o["mesh_verts"].items():
            m.mesh_vert[m.mesh_vertadr[k] : m.mesh_vertadr[k] + m.mesh_vertnum[k]] = verts * s
        for k, aabb in o["mesh_bvh"].items():
            m.bvh_aabb[m.mesh_bvhadr[k] : m.mesh_bvhadr[k] + m.mesh_bvhnum[k]] = aabb * s
        for b, aabb in o["body_bvh"].items():
            m.bvh_aabb[m.body_bvhadr[b] : m.body_bvhadr[b] + m.body_bvhnum[b]] = aabb * s
        for g in o["all_geoms"]:
            m.geom_size[g] = o["geom_size"][g] * s
            m.geom_pos[g] = o["geom_pos"][g] * s
            m.geom_rbound[g] = o["geom_rbound"][g] * s
            m.geom_aabb[g] = o["geom_aabb"][g] * s
        roots = set(self.object_bodies)
        for bodies in o["obj_bodies"]:
            for b in bodies:
                if b not in roots:  # child bodies sit at scaled offsets from their parent
                    m.body_pos[b] = o["body_pos"][b] * s
                m.body_mass[b] = o["body_mass"][b] * s**3
                m.body_inertia[b] = o["body_inertia"][b] * s**5
        for site in o["sites"]:
            m.site_pos[site] = o["site_pos"][site] * s
        # robosuite places objects from their Python-side size; keep it in step so they
        # rest on the table after the next reset instead of starting inside it.
        for obj, (kind, value) in zip(self.objects, o["py_sizes"]):
            if kind == "size":
                obj.size = value * s
            else:
                for el, pos in value.items():
                    el.set("pos", " ".join(repr(float(x) * s) for x in pos.split()))
