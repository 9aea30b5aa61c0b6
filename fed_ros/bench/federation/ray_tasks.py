"""`fed-ros bench federation --ray [ADDRESS]`: the cells as Ray tasks, local or on a cluster.

Each task runs the one cell function every executor runs (`federation.cells.compute_cell`) with
one torch thread and ``MUJOCO_GL=egl``, and returns its record; the driver writes the cell files
itself, so a cluster without a shared filesystem works too. Demos are generated once on the
driver and travel with the tasks inside the (pickled) demo cache, so workers never read
``<out>``. Cells already cached never become tasks, and Ray is not started when none is left.
Ray is an optional extra (``pip install 'fed_ros[ray]'``), imported only here, only when used.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Sequence

from fed_ros.bench.federation.cells import compute_cell, prepare_demos, store_cell
from fed_ros.bench.federation.demos import DemoCache
from fed_ros.bench.federation.run import CellSpec
from fed_ros.core.extras import require

log = logging.getLogger("fed_ros.bench.federation")

LOCAL = "local"  # --ray without an address: a fresh Ray instance on this machine
# Every task's environment: headless MuJoCo rendering, and one OpenMP thread per task so
# tasks side by side do not oversubscribe the cores (the shard workers' setting).
TASK_ENV = {"MUJOCO_GL": "egl", "PYOPENGL_PLATFORM": "egl", "OMP_NUM_THREADS": "1"}


def import_ray() -> Any:
    """The ``ray`` module, or MissingExtra naming the install command."""
    return require("ray", "ray", "--ray")


def ray_cell(spec: CellSpec, cache: DemoCache) -> dict[str, Any]:
    """The Ray task: one cell's record, computed as a shard worker computes it."""
    import torch

    torch.set_num_threads(1)  # as the shard workers: one thread per cell running side by side
    return compute_cell(spec, cache)


class RayExecutor:
    """Cells as Ray tasks of one CPU each; ``address`` None or ``local``: a local Ray instance
    of ``num_cpus`` CPUs (None: every core), else the cluster at ``address`` (``auto``,
    ``HOST:PORT``). ``submitted`` counts the tasks this executor submitted."""

    def __init__(self, address: str | None = None, num_cpus: int | None = None) -> None:
        if num_cpus is not None and num_cpus < 1:
            raise ValueError(f"--jobs (Ray CPUs) must be >= 1, got {num_cpus}")
        self.address = None if address in (None, LOCAL) else address
        self.num_cpus = num_cpus
        self.submitted = 0

    def _init(self, ray: Any) -> bool:
        """Connect (starting local Ray if asked); False when this process already was."""
        if ray.is_initialized():
            return False
        common = dict(
            include_dashboard=False,
            log_to_driver=False,  # task failures come back through ray.get, as exceptions
            runtime_env={"env_vars": TASK_ENV},
        )
        if self.address is None:
            ray.init(address=LOCAL, num_cpus=self.num_cpus, **common)
        else:
            ray.init(address=self.address, **common)
        return True

    def run(
        self, todo: Sequence[CellSpec], out: Path, cache: DemoCache, bar: Any
    ) -> dict[str, dict[str, Any]]:
        """Submit every cell, store each record as its task finishes."""
        where = self.address or f"local Ray ({self.num_cpus or 'all'} CPUs)"
        if not todo:
            log.info("ray: 0 cell tasks submitted to %s (nothing left to run)", where)
            return {}
        ray = import_ray()
        prepare_demos(todo, cache)
        owned = self._init(ray)
        done: dict[str, dict[str, Any]] = {}
        try:
            task = ray.remote(num_cpus=1)(ray_cell)
            cache_ref = ray.put(cache)  # demos shipped once, shared by every task
            specs = {task.remote(spec, cache_ref): spec for spec in todo}
            self.submitted += len(specs)
            log.info("ray: %d cell tasks submitted to %s", len(specs), where)
            pending = list(specs)
            while pending:
                ready, pending = ray.wait(pending, num_returns=1)
                for ref in ready:
                    spec = specs[ref]
                    done[spec.key] = rec = ray.get(ref)
                    store_cell(out, spec, rec)
                    bar.set_postfix_str(f"done {spec.key}")
                    bar.update(1)
        finally:
            if owned:
                ray.shutdown()
        return done
