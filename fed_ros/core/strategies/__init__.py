"""One module per strategy; build them with `fed_ros.core.strategy.make_strategy(name, **settings)`."""
