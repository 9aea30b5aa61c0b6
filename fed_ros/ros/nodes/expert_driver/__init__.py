"""The scripted-expert driver node (``fed-ros-expert-driver``)."""
