"""temporal-rollouts: durable, sandboxed agent rollouts for RL on Temporal.

The one import name this project adds besides the top-level `workflows`, `activities`,
`envs` and `worker`. Its subpackages are layered, each importing only from those below:

    cli, runtime, integrations, demo_policy   top: user interfaces and wiring
    sinks, (envs)                             groups and where they go
    llm | sandbox | storage | tools           the parts
    core                                      shared models, errors, settings
    sandbox_server                            a separate program: imports nothing above

Nothing is imported here, so a sandbox image can carry `sandbox_server` alone.
"""
