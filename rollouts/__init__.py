"""temporal-rollouts: durable, sandboxed agent rollouts for RL on Temporal."""
