"""Fixtures every tier may use: the real-model fixtures (SmolLM2 behind /generate), which start
nothing until a test asks for them. The integration fixtures (dev server, sandbox, demo
policy, worker) are in tests/support/fixtures.py, loaded by the integration and end-to-end tiers."""

from tests.support.servers.fixtures import (  # noqa: F401  (fixtures, shared by every module)
    own_smollm2_server,
    smollm2_gguf,
    smollm2_model,
    smollm2_process,
    smollm2_server,
    smollm2_tokenizer,
)
