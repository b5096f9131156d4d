r"""Exports a run's policy as a Hugging Face directory.

  python scripts/export.py --workdir=runs/gsm8k --out=/tmp/qwen-gsm8k [--step=N] [--adapter_only]

Reads the configuration the run started with (WORKDIR/config.json) and the params of its
latest sealed checkpoint whose files match their checksums (or of step N, which must be
one), and writes config.json, model*.safetensors,
generation_config.json (every stop id) and, for a run with a Hugging Face tokenizer, its
tokenizer files: a directory that transformers' AutoModelForCausalLM and AutoTokenizer
load. A run with the byte-level tokenizer exports the model alone.

A LoRA run (model.lora_rank > 0) exports its adapters merged into the base weights (the
same directory layout, no adapters left), or with --adapter_only a PEFT adapter
(adapter_config.json, adapter_model.safetensors) that `peft.PeftModel.from_pretrained`
puts on the base model (model.checkpoint); docs/lora.md.

A workdir without config.json or checkpoints, or a missing step: exit 2, one line. So is
an install without the `hf` extra (safetensors), before anything is read or written.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from absl import app, flags, logging  # noqa: E402

_WORKDIR = flags.DEFINE_string("workdir", None, "A run's directory.", required=True)
_OUT = flags.DEFINE_string("out", None, "The directory to write.", required=True)
_STEP = flags.DEFINE_integer("step", None, "The checkpoint step (default: the latest).")
_ADAPTER_ONLY = flags.DEFINE_bool(
    "adapter_only", False, "A LoRA run: write its adapters as a PEFT adapter directory."
)


def _fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def main(argv):
    del argv
    logging.set_verbosity(logging.ERROR)
    try:  # the `hf` extra's; the README's plain `pip install -e .` does not install it
        import safetensors.numpy  # noqa: F401
    except ImportError:
        _fail("export writes safetensors, which is not installed: pip install -e '.[hf]'")
    from replax.config import spec as spec_lib
    from replax.core.config_utils import ConfigError
    from replax.hf import adapters
    from replax.hf import checkpoint as hf
    from replax.hf import config as hf_config
    from replax.model import lora
    from replax.run import assemble as run_lib
    from replax.run import checkpoint, frozen_base

    workdir = _WORKDIR.value
    path = os.path.join(workdir, "config.json")
    ckpt_dir = os.path.join(workdir, "checkpoints")
    if not os.path.isfile(path):
        _fail(f"--workdir={workdir} has no config.json: not a replax run directory")
    if not os.path.isdir(ckpt_dir):
        _fail(f"--workdir={workdir} has no checkpoints/")
    try:  # a config.json of an older replax is migrated on the way in
        with open(path) as f:
            spec = spec_lib.parse(json.load(f))
        run = run_lib.build(spec, workdir)
    except ConfigError as e:
        _fail(str(e))
    train_state, _ = run_lib.abstract_states(run)  # the structure to restore into
    reader = checkpoint.Checkpointer(ckpt_dir)
    try:  # a step without a valid seal is never read
        step = reader.pick_sealed(_STEP.value, log=lambda line: print(line, file=sys.stderr))
        params = frozen_base.restore_train_state(run, reader, step, train_state).params
    except ConfigError as e:
        _fail(str(e))
    finally:
        reader.close()
    config = run.model_config
    if _ADAPTER_ONLY.value:
        if not lora.enabled(config):
            _fail(f"--adapter_only: the run at {workdir} has no adapters (model.lora_rank=0)")
        written = adapters.save_peft(_OUT.value, params, config, base_model=spec.model.checkpoint)
        print(f"step {step} of {workdir} -> {_OUT.value} (PEFT adapter: {', '.join(written)})")
        return
    if lora.enabled(config):  # the adapters folded into the weights they adapt
        params, config = lora.merged(params, config), lora.base_config(config)
    tokenizer_dir = None
    if spec.tokenizer.name == "hf":
        tokenizer_dir = spec.tokenizer.path or spec.model.checkpoint
        if os.path.isfile(tokenizer_dir):
            tokenizer_dir = os.path.dirname(tokenizer_dir)
    written = hf.save_pretrained(
        _OUT.value,
        config,
        params,
        tokenizer_dir=tokenizer_dir,
        generation=hf_config.generation_config(run.tokenizer),
    )
    print(f"step {step} of {workdir} -> {_OUT.value} ({len(written)} files)")


if __name__ == "__main__":
    from replax.core.config_utils import parse_flags_or_exit

    app.run(main, flags_parser=parse_flags_or_exit)
