"""The robot node (``fed-ros-robot``) and its helpers."""
