"""A trivial env whose cost is all machinery, for benchmarks."""

from envs.echo_chain.env import EchoChainEnv

__all__ = ["EchoChainEnv"]
