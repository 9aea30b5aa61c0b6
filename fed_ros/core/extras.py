"""Optional extras (setup.py extras_require): what each is for and the one line a user sees
when a command needs one that is not installed, instead of an ImportError trace."""

from __future__ import annotations

import importlib
from typing import Any

INSTALL_COMMANDS = {
    "tracking": "pip install 'fed_ros[tracking]' (or: pip install tensorboard)",
    "mlflow": "pip install 'fed_ros[mlflow]' (or: pip install mlflow-skinny)",
    "dataset": (
        "pip install 'fed_ros[dataset]' (or: pip install 'pyarrow<21' 'pandas<2.3' Pillow av)"
    ),
    "ray": "pip install 'fed_ros[ray]' (or: pip install ray)",
}


class MissingExtra(RuntimeError):
    """An optional extra is not installed; the message is the one line to show."""


def require(module: str, extra: str, what: str) -> Any:
    """``module`` imported, or MissingExtra: "<what> needs <module>: <install command>"."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingExtra(f"{what} needs {module}: {INSTALL_COMMANDS[extra]}") from None
