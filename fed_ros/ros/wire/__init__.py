"""What crosses the wire: message conversions, chunked/bulk transfer, QoS profiles, image
encoding."""
