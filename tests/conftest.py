"""Test set-up: 8 simulated CPU devices so that sharding tests run anywhere (compiled as
tests/xla_flags.py says), and one persistent compilation cache for the scripts the tests
start."""

import contextlib
import os
import shutil
import tempfile

import xla_flags

xla_flags.add_to_environment()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import pytest  # noqa: E402

from replax.model.config import ModelConfig  # noqa: E402

# The cache below is for the scripts' processes; compiles in the test processes stay
# uncached, since several tests count them (a cache hit is not a backend compile).
jax.config.update("jax_compilation_cache_dir", None)

_CACHE_ENV = "JAX_COMPILATION_CACHE_DIR"


def pytest_configure(config):
    """One persistent XLA compilation cache, for this test run only, shared by every
    process a test starts (train.py, compare.py, evaluate.py ...): dozens of them compile
    the same micro programs, and a micro run that finds its programs there starts in about
    a third of the time on 2 cores. Set in the controlling process before xdist starts its
    workers, so that all of them inherit the one directory; a directory already named in
    the environment is used as it is (and kept)."""
    if _CACHE_ENV in os.environ:
        return
    config._replax_xla_cache = tempfile.mkdtemp(prefix="replax-tests-xla-cache-")
    os.environ[_CACHE_ENV] = config._replax_xla_cache
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"


def pytest_unconfigure(config):
    path = getattr(config, "_replax_xla_cache", None)
    if path:
        shutil.rmtree(path, ignore_errors=True)


# The tiny policy most model-level tests run: 2 layers, grouped kv heads (4 query heads
# over 2), heads x head_dim = d_model. Tests that need another shape say why beside it.
TINY = ModelConfig(
    vocab_size=64,
    num_layers=2,
    d_model=32,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    mlp_dim=64,
    max_len=16,
)


@pytest.fixture
def tiny_config() -> ModelConfig:
    return TINY


def numpy_params(model, seed: int, scale: float):
    """Random params of `model` drawn in numpy (no compile): weights ~ N(0, scale^2), norm
    scales ~ 1 + N(0, scale^2)."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import numpy as np

    dummy = jnp.zeros((1, 1), jnp.int32)
    shapes = nn.unbox(jax.eval_shape(model.init, jax.random.key(0), dummy, dummy))["params"]
    rng = np.random.default_rng(seed)
    return jax.tree_util.tree_map_with_path(
        lambda path, x: (
            (1.0 if path[-1].key == "scale" else 0.0) + scale * rng.normal(size=x.shape)
        ).astype(x.dtype),
        shapes,
    )


@contextlib.contextmanager
def count_compilations():
    """Counts XLA compilations (backend_compile events) inside the block."""
    events = []

    def listener(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            events.append(event)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield events
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
