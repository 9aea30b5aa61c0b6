"""The teleoperation node (``fed-ros-teleop``)."""
