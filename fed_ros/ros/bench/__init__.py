"""Benchmarks that talk DDS (the ROS layer is the only one that imports rclpy); the pure ones are in
:mod:`fed_ros.bench`. ``fed-ros bench <name>`` runs either kind (fed_ros/cli.py). Tooling, not
product: no node, wire, arm, configuration, fleet or operator module imports them."""
