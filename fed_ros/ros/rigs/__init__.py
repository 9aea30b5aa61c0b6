"""Test and benchmark rigs that run real fleets: scripted robots, the attacker, network namespaces,
ROS domain allocation and the reference federation. Tooling, not product: no node, wire, arm,
configuration, fleet or operator module imports them (test_layering)."""
