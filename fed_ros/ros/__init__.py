"""ROS 2 layer: message conversions, QoS, transport, nodes, fleet plan. The only layer importing
rclpy."""
