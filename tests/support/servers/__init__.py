"""Real servers that tests run as processes: run-api, the demo policy, and the CPU generate server
(temporal_rollouts/policy_servers/cpu_generate.py) through fixtures.py."""
