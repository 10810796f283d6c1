"""temporal-rollouts: durable, sandboxed agent rollouts for RL on Temporal.

The one import name this project adds besides the top-level `workflows`, `activities`,
`envs` and `worker`. Its subpackages are layered, each importing only from those below
(docs/layout.md draws every floor, tests/unit/test_layers.py holds them):

    cli | view | integrations | policy_servers.demo   top: user interfaces, never each other
    client                                            the control layer: start, query, list runs
    runtime                                           the worker's assembly, Temporal, exit codes
    sinks, (envs)                                     groups and where they go
    llm | sandbox | storage | tools                   the parts
    core                                              shared models, errors, settings
    sandbox_server                                    a separate program: imports nothing above

Nothing is imported here, so a sandbox image can carry `sandbox_server` alone.
"""
