"""Agent harnesses the project ships: programs that run inside a slot as the agent and talk to the
rollout's model endpoint. Each imports nothing of the project, since a slot has only its bundle."""
