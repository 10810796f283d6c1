"""Model servers the project ships: a policy a user can run with no GPU.

`cpu_generate` serves a small real model (SmolLM2-135M-Instruct, `smollm2`) on CPU
behind SGLang's and vLLM's native `/generate`, with SGLang's weight-update routes, so
the whole RL loop (token-exact rollouts, a trainer, new weights served as the next
version) runs on a laptop. It started as a test fixture; it lives in the product
because the same program is what the GRPO example (examples/grpo/) trains against
and what the tests check, and a user needs it without the test tree.

Like the sandbox server it is a separate program: it imports nothing else of the
project. torch and transformers come with the `rl` extra.
"""
