"""Every module of the package imports (a moved or renamed module leaves no dangling import).

The layering test reads imports without running them; this runs them, so an import of a name
from the wrong module fails here in seconds instead of as a node that never starts.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "fed_ros"


def _module_name(path: Path) -> str:
    parts = ("fed_ros", *path.relative_to(PACKAGE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = sorted(_module_name(p) for p in PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("module", MODULES)
def test_module_imports(module):
    importlib.import_module(module)
