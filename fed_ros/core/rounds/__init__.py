"""The round protocol without ROS: the coordinator (state machine), one stage's answers, the
round config a robot obeys, the round report, the roster, the crash-safe store, delivery
bookkeeping and fault injection for crash tests."""
