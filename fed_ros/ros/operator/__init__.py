"""What an operator uses to watch and drive a running fleet: the status monitor, the web view,
the Foxglove layout and ``fed-ros robot``."""
