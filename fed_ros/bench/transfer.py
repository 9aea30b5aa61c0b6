"""`fed-ros bench transfer`: model transfer throughput, ROS 2 default / tuned / zmq / memcpy.

The benchmark talks DDS, so its body lives in the ROS layer (`fed_ros.ros.wire.transfer_bench`),
the only layer that imports rclpy; this module is the CLI entry point.
"""
from fed_ros.ros.wire.transfer_bench import main

__all__ = ["main"]
