"""replax: RL post-training of language models with experience replay, in JAX."""

__version__ = "0.1.0"
