"""replax: RL post-training of language models with experience replay, in JAX.

The packages, each importing only those on the floors below it (its own `May import:`
line; tests/test_layout.py checks every import, deferred ones included):

    tools      what the scripts drive: command lines, comparisons, TPU compiles
    run        a run assembled, trained, checkpointed and observed
    config     a config file to a typed, validated RunSpec
    rl         rollouts, objectives, the train step, placement, evaluation
    replay     the on-device replay store and its schedules
    sampling   the jitted KV-cache sampler
    hf         Hugging Face and GGUF checkpoints in and out
    model      the Flax decoder, attention, log-probs, FLOPs
    tasks      tasks with verifiable rewards, graders, the prompt pipeline
    text       tokenizers and prompt formatting
    core       mesh and sharding, config errors, categorical draws
"""

from replax.core import platforms as _platforms

__version__ = "0.1.0"

# Before any module of replax imports JAX: a machine without a TPU never starts libtpu.
_platforms.skip_absent_tpu()
