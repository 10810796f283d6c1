from temporal_rollouts.door.server import main

main()
