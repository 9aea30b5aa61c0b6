"""Federated core: parameters, strategies, clustering, robust rules, model store (numpy/scipy only)."""
