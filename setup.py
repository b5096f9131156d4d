"""replax: RL post-training of language models with experience replay, in JAX."""

import setuptools

setuptools.setup(
    name="replax",
    version="0.1.0",
    description="JAX-native RL post-training of language models with experience replay.",
    packages=setuptools.find_packages(include=["replax", "replax.*"]),
    python_requires=">=3.10",
    install_requires=[
        "jax>=0.4.35",
        "flax>=0.10",
        "optax>=0.2.5",
        "orbax-checkpoint>=0.11",
        "grain>=0.2.10",
        "tensorflow-datasets>=4.9.7",
        "array-record>=0.7",
        "ml-collections>=1.0",
        "absl-py",
        "numpy",
        "tensorboardX>=2.6",
        "matplotlib>=3.7",
    ],
    extras_require={
        "test": [
            "pytest>=8",
            "pytest-xdist>=3",
            "ruff>=0.6",
            "nbformat>=5",
            "nbclient>=0.10",
            "ipykernel>=6",
            "tokenizers>=0.15",
            "safetensors>=0.4",
        ],
        "bench": ["flashbax>=0.1.3"],
        "hf": ["safetensors>=0.4", "tokenizers>=0.15"],
    },
)
