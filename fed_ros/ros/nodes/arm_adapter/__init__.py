"""The arm adapter node (``fed-ros-arm-adapter``): a real arm's ROS 2 interfaces to the fed_ros
arm topics, and its helpers."""
