"""Simulated arms: robosuite environments, scripted experts, evaluation (no ROS)."""
