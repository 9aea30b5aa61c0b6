"""Onboard learning: policies, losses, local trainer, datasets, descriptors (torch, no ROS)."""
