"""Atropos: the trajectory API client (`api`, no atroposlib needed) and a `BaseEnv` whose
rollouts are our Temporal workflows (`env`, needs `pip install 'temporal-rollouts[rl]'`)."""
