"""The sandbox server: the program that runs inside each container and owns its slots.

Its own package, importing nothing else of the project (standard library, pydantic,
starlette, uvicorn), so a container image needs only this folder. `schema` holds the
request and response models the worker's pool speaks; `errors` the typed errors that
cross HTTP. Run it with `python -m temporal_rollouts.sandbox_server`.
"""
