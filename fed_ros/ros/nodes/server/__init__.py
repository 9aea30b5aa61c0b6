"""The server node (``fed-ros-server``) and its helpers."""
