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
            "jinja2>=3.1.6",
            "pyarrow>=14",
        ],
        "bench": ["flashbax>=0.1.3"],
        # Real models: HF checkpoints, tokenizers and chat templates, parquet data (a saved
        # `datasets` directory also needs `pip install datasets`).
        "hf": ["safetensors>=0.4", "tokenizers>=0.15", "jinja2>=3.1.6", "pyarrow>=14"],
        # tests/test_parity.py: replax against transformers itself (CPU torch), a real
        # tokenizer.json (the one the anthropic 0.34 wheel ships, used as test data only)
        # and saved datasets directories.
        "parity": [
            "torch==2.13.0",
            "transformers==5.24.0",
            "anthropic==0.34.0",
            "datasets>=3",
        ],
    },
)
