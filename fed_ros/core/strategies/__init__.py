"""Strategies (Flower's shape): the Strategy interface and registry (base), the data types they
take and give (types), aggregation arithmetic and robust rules, and one module per strategy.
A new strategy is a module here plus one line in base.STRATEGIES."""
