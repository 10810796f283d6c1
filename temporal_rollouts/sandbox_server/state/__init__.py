"""What a sandbox server writes down so that a restarted process carries on, and what it tells.

Stored results by call id, the lease journal and the execution log (`persistence`); the lease
event log that tests and benchmarks read (`lease_log`).
"""
