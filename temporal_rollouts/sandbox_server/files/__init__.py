"""Workspace files as the server itself touches them, on the host side of the sandbox.

Every path is opened beneath the workspace's descriptor, never through a link (`beneath`);
reads, writes and the walk that counts a workspace (`workspace`, `disk_usage`); output cut to
a head and a tail as it is read (`output`); folders as tar streams with holes kept (`archive`,
`sparse`); the container's shared, read-only cache (`cache`); and a slot's root on an item image, the
image's layers under the slot's own writable layer (`image_root`).
"""
