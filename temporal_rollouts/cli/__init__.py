"""`rollouts`, the command line: its flags and the words it prints for batches (`main`), their progress
(`progress`), resuming (`resume`), reading rollouts back (`inspect`, `list_rollouts`), training runs
(`train`) and forks (`fork`). The work is the control layer's (temporal_rollouts/client/)."""
