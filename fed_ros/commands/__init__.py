"""The command-line layer's argument parsing for commands whose work lives in a lower layer.

Each module here turns ``argv`` into a call of a plain typed function in ``fed_ros.core``,
``fed_ros.learning`` or ``fed_ros.sim`` (no ``argparse`` below this layer, issue 38) and is a
``module:function`` target of :mod:`fed_ros.cli` or runs with ``python -m``.
"""
