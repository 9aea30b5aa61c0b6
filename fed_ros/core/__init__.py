"""Federated core (numpy/scipy only; no ROS, no torch), one folder per concept:

strategies/  the Strategy interface and registry, data types, aggregation, robust rules, one
             module per strategy
clustering/  CUA, SRB, FeDepth's Jeffreys clusters, RND federations, k-means
rounds/      the round state machine, stage answers, round config, report, roster, store, delivery
checks/      Decision and every input check, bounds, the audit log
security/    keys, signatures, replay protection, registration proofs, the attack harness
arm/         arm profiles, the safety filter, the tick schedule, the arm-state store
data/        the Episode contract and non-IID partitioning
encodings/   the registry of update and model encodings (one module each) and the delta
             encodings' error feedback
params.py    model parameters as named float32 tensors; diagnostics.py: node health statuses
"""
