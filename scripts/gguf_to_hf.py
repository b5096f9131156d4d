r"""Converts a llama.cpp GGUF file of a Llama-architecture model to a Hugging Face directory.

  python scripts/gguf_to_hf.py --gguf=SmolLM2-135M-Instruct.Q4_1.gguf --out=/tmp/smollm2 \
      [--dtype=float32|bfloat16]

Writes config.json, model.safetensors (dequantised weights in --dtype), tokenizer.json,
tokenizer_config.json (the GGUF's chat template) and generation_config.json; replax
(`--config.model.checkpoint=DIR`) and transformers load the directory. A quantised GGUF
gives its dequantised weights, not those of the model it was quantised from.

A missing file, another architecture, a tensor type or tokenizer the converter cannot
read, or no `gguf` package: exit 2, one line naming it and what is supported.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from absl import app, flags, logging  # noqa: E402

_GGUF = flags.DEFINE_string("gguf", None, "The GGUF file to convert.", required=True)
_OUT = flags.DEFINE_string("out", None, "The directory to write.", required=True)
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Weights' dtype.")


def main(argv):
    del argv
    logging.set_verbosity(logging.ERROR)
    from replax.core.config_utils import ConfigError
    from replax.hf import gguf

    try:
        written = gguf.convert(_GGUF.value, _OUT.value, dtype=_DTYPE.value)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    print(f"{_GGUF.value} -> {_OUT.value} ({len(written)} files, {_DTYPE.value})")


if __name__ == "__main__":
    from replax.core.config_utils import parse_flags_or_exit

    app.run(main, flags_parser=parse_flags_or_exit)
