"""The trainer door: a training run's batches, served by the project to any trainer.

`python -m temporal_rollouts.door` (or `rollouts train serve`) runs the endpoint (`server.py`: the
HTTP routes in `app.py` over the run's workflow and the object store in `runs.py`); `client.py` is
what a trainer imports, with httpx as its only dependency.
"""
