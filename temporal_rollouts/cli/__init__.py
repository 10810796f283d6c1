"""`rollouts`, the command line: batches (`main`), their progress and exit codes (`progress`),
resuming (`resume`), reading rollouts back (`records`, `inspect`) and training runs (`train`)."""
