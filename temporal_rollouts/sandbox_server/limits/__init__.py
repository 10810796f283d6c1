"""A slot's memory, CPU and process limits, and the uid its commands run as.

`confinement` applies them with the best mechanism the host has (cgroups v2 or v1, rlimits);
where no cgroup holds a slot as a whole, the `watchdog` does, counting shared memory once per
object (`shared_memory`). Disk and file limits are the volumes' (`volumes`).
"""
