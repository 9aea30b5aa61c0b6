"""`fed-ros bench federation --jobs N`: cells side by side in N worker processes.

Workers are plain subprocesses of the same command restricted to their cells (``--cells``):
each runs them with `SerialExecutor` and writes every finished cell as its JSON file, which the
parent reads back, so nothing is pickled between processes. Demos are generated once, before
the workers start, so workers only read the demo cache.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from fed_ros.bench.federation.cells import SerialExecutor, prepare_demos
from fed_ros.bench.federation.demos import DemoCache
from fed_ros.bench.federation.run import CellSpec, cell_path


class ShardExecutor:
    """The cells still to run, split round-robin among ``jobs`` worker subprocesses."""

    def __init__(self, jobs: int, worker_argv: Sequence[str]) -> None:
        if jobs < 1:
            raise ValueError(f"--jobs must be >= 1, got {jobs}")
        self.jobs = jobs
        self.worker_argv = list(worker_argv)

    def _worker(self, shard: Sequence[CellSpec]) -> subprocess.Popen:
        cmd = [
            sys.executable,
            "-c",
            "import sys; from fed_ros.bench.federation.command import main; "
            "sys.exit(main(sys.argv[1:]))",
            *self.worker_argv,
            "--jobs",
            "1",
            "--no-report",
            "--cells",
            ",".join(spec.key for spec in shard),
        ]
        return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def run(
        self, todo: Sequence[CellSpec], out: Path, cache: DemoCache, bar: Any
    ) -> dict[str, dict[str, Any]]:
        """Run the shards and collect each cell's JSON as it appears."""
        if self.jobs <= 1 or len(todo) <= 1:
            return SerialExecutor().run(todo, out, cache, bar)
        prepare_demos(todo, cache)
        shards = [list(todo[i :: self.jobs]) for i in range(self.jobs)]
        procs = [self._worker(shard) for shard in shards if shard]
        done: dict[str, dict[str, Any]] = {}
        pending = {spec.key: spec for spec in todo}
        while pending:
            for key in list(pending):
                path = cell_path(out, pending[key])
                if path.is_file():
                    done[key] = json.loads(path.read_text())
                    bar.set_postfix_str(f"done {key}")
                    bar.update(1)
                    del pending[key]
            if all(p.poll() is not None for p in procs):
                # A worker reported these as failed (not saved): run them here to get the error.
                done.update(SerialExecutor().run(list(pending.values()), out, cache, bar))
                pending = {}
            time.sleep(1.0)
        return done
