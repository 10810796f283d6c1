"""Each slot's volume: the one place its files live, held to its disk and file limits.

`slot_volume` chooses how (an ext4 image of its own through `loop_fs` and `loop_device`,
mounted in the server's own namespace by `mount_namespace`; else a checked folder), and
`disk_watch` says what a volume holds and when a checked one is walked.
"""
