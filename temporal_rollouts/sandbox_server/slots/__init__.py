"""The slots of one container, leased to rollouts.

`manager` (the SlotManager) decides who holds which slot and when; `waitline` is the
first-come, first-served line of acquires; `slotbook` writes every change of a slot's state
down the same way; `disk_guard` holds leased slots to their disk limits between calls.
"""
