from temporal_rollouts.cli.main import run

run()
