"""The arm side: arm topics, the arm client used by policies and experts, the recorder."""
