"""The `salon bench` load generator: a seeded Character.AI-style dialogue workload replayed through the gateway."""
