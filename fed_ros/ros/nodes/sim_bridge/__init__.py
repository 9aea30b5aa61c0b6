"""The MuJoCo sim bridge node (``fed-ros-sim-bridge``) and its helpers."""
