"""ROS 2 nodes: thin Node subclasses that turn messages into calls of the core/learning/sim code."""
