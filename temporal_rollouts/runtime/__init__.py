"""Running the system on a machine: the Temporal connection and embedded server, the demo policy process, the reaper schedule."""
