"""Benchmarks behind `fed-ros bench <name>`; each prints measured ratios side by side."""
