"""Who may talk to the fleet: Ed25519 keys and signatures, allow-lists, replay protection,
authenticated registration, and the attack harness the robustness benchmark and tests use."""
