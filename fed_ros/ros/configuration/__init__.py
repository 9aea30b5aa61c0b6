"""The nodes' parameter schemas (pure Python, no rclpy): what every node declares, what the fleet
plan fills in and what a live ``ros2 param set`` is checked against."""
