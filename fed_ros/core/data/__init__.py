"""Demonstration data: the Episode contract between arms, recording and learning, and non-IID
partitioning of a demonstration pool across robots."""
