"""Hugging Face checkpoints of the Llama / Qwen2 / Qwen3 family in and out of replax.

`load_pretrained(dir)` reads config.json and model.safetensors (or the shards listed in
model.safetensors.index.json) into a `model.ModelConfig` and host numpy params of
`model.Transformer(config)`; `load_pretrained_sharded(dir, mesh, rules)` places each
parameter straight into its NamedSharding, reading only each device's block from the
files; `save_pretrained` writes them back in the HF layout, with the tokenizer files and a
generation_config.json when given a tokenizer directory. Only safetensors, numpy and
ml_dtypes are needed (no torch, no transformers).

The HF tensor layout is `replax.hf.layout`, config.json `replax.hf.config`.

Anything replax cannot represent (architecture, RoPE type, activation, a missing or
mis-shaped tensor) raises a one-line ValueError naming it and what is allowed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from replax.core import sharding
from replax.hf import layout as hf_layout
from replax.hf.config import CONFIG_NAME, config_to_hf, generation_config, read_config
from replax.model import transformer as model_lib

WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
_SHARD_RE = re.compile(r"^model-\d{5}-of-\d{5}\.safetensors$")


def _read_safetensors(path: str) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    try:
        return load_file(path)
    except (KeyError, TypeError):  # safetensors without numpy bfloat16: read it directly.
        return {k: np.array(v) for k, v in _read_safetensors_raw(path).items()}


_SAFETENSORS_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}


def _read_safetensors_raw(path: str) -> dict[str, np.ndarray]:
    """A safetensors file as read-only numpy memory maps (BF16 through ml_dtypes): nothing
    is read until a tensor, or a slice of one, is."""
    import ml_dtypes

    with open(path, "rb") as f:
        (header_len,) = np.frombuffer(f.read(8), dtype="<u8")
        header = json.loads(f.read(int(header_len)))
    data_start = 8 + int(header_len)
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in _SAFETENSORS_DTYPES:
            raise ValueError(
                f"{path}: tensor {name} has dtype {info['dtype']}: allowed are "
                f"{sorted(_SAFETENSORS_DTYPES)}"
            )
        name_of = _SAFETENSORS_DTYPES[info["dtype"]]
        dtype = np.dtype(ml_dtypes.bfloat16 if name_of == "bfloat16" else name_of)
        start, end = info["data_offsets"]
        shape = tuple(info["shape"])
        if end == start:
            out[name] = np.zeros(shape, dtype.newbyteorder("<"))
            continue
        out[name] = np.memmap(
            path, dtype=dtype.newbyteorder("<"), mode="r", offset=data_start + start, shape=shape
        )
    return out


def _weight_map(path: str) -> dict[str, str]:
    """Tensor name -> safetensors file name of a checkpoint directory."""
    index_path = os.path.join(path, INDEX_NAME)
    if os.path.exists(index_path):
        with open(index_path) as f:
            return dict(json.load(f)["weight_map"])
    if os.path.exists(os.path.join(path, WEIGHTS_NAME)):
        return {}  # one file: its names are read from its header
    raise ValueError(f"{path}: neither {WEIGHTS_NAME} nor {INDEX_NAME} found")


def load_pretrained(path: str, **config_overrides):
    """(config, params) from an HF checkpoint directory: config.json plus model.safetensors,
    or the shards named by model.safetensors.index.json. `config_overrides` go to
    `config_from_hf`; params are host numpy arrays in config.param_dtype. For params placed
    on a mesh without a host copy of the whole model, see `load_pretrained_sharded`."""
    config = read_config(path, **config_overrides)
    weight_map = _weight_map(path)
    files = sorted(set(weight_map.values())) or [WEIGHTS_NAME]
    tensors: dict[str, np.ndarray] = {}
    for name in files:
        for key, value in _read_safetensors(os.path.join(path, name)).items():
            if key in tensors:
                raise ValueError(f"tensor {key} appears in more than one shard ({name})")
            tensors[key] = value
    return config, hf_layout.params_from_hf(tensors, config)


class _LazyTensors:
    """The tensors of a checkpoint directory, opened with safetensors.safe_open (numpy) so
    that a slice reads only its bytes; numpy memory maps where safe_open cannot (an older
    safetensors without bfloat16). Use as a context manager."""

    def __init__(self, path: str):
        self.path = path
        self._weight_map = _weight_map(path)
        self._stack = contextlib.ExitStack()
        self._files: dict[str, Any] = {}

    def __enter__(self):
        from safetensors import safe_open

        files = sorted(set(self._weight_map.values())) or [WEIGHTS_NAME]
        self.names: dict[str, str] = {}
        for file in files:
            full = os.path.join(self.path, file)
            if not os.path.isfile(full):
                raise ValueError(f"{full}: not found (named by {INDEX_NAME})")
            try:
                handle = self._stack.enter_context(safe_open(full, framework="numpy"))
                keys = list(handle.keys())
                # One empty read per dtype in the file: can this safetensors give numpy it?
                probes = {handle.get_slice(k).get_dtype(): k for k in keys}
                for key in probes.values():
                    if len(handle.get_slice(key).get_shape()):
                        handle.get_slice(key)[(slice(0, 0),)]
            except (AttributeError, KeyError, TypeError, ValueError):
                handle = _read_safetensors_raw(full)
                keys = list(handle)
            except Exception as e:  # noqa: BLE001 - safetensors' own error for a bad file
                raise ValueError(f"{full}: not a readable safetensors file ({e})") from None
            self._files[file] = handle
            for key in keys:
                if key in self.names:
                    raise ValueError(f"tensor {key} appears in more than one shard ({file})")
                self.names[key] = file
        return self

    def __exit__(self, *exc):
        self._stack.close()

    def slice(self, name: str):
        """An object with numpy slicing that reads only the selected block."""
        handle = self._files[self.names[name]]
        return handle[name] if isinstance(handle, dict) else handle.get_slice(name)

    def shape(self, name: str) -> tuple[int, ...]:
        view = self.slice(name)
        return tuple(view.shape) if hasattr(view, "shape") else tuple(view.get_shape())


def load_pretrained_sharded(
    path: str, mesh, rules=sharding.DEFAULT_RULES, **config_overrides
) -> tuple[model_lib.ModelConfig, dict[str, Any]]:
    """(config, params) with every parameter a jax.Array already in the NamedSharding its
    logical axes get under `rules` on `mesh` (what `shard_params` gives for the same mesh).

    Each parameter is built with jax.make_array_from_callback: for each of this process's
    devices, only that device's block is read from the safetensors file (safe_open slices),
    transposed to replax's layout and cast to config.param_dtype. Blocks that several
    devices share are read once. The host never holds more than one parameter's worth of
    blocks, so a model larger than host memory loads as long as each device's part fits.
    Names and shapes are checked from the file headers before anything is read.
    """
    import ml_dtypes  # noqa: F401 - registers bfloat16 with numpy

    config = read_config(path, **config_overrides)
    target = hf_layout.np_dtype(None, config)
    rules = sharding.validate_rules(rules)
    dummy = jnp.zeros((1, 1), jnp.int32)
    abstract = jax.eval_shape(
        lambda: model_lib.Transformer(config).init(jax.random.key(0), dummy, dummy)
    )
    shardings = sharding.params_shardings(mesh, abstract, rules)["params"]
    params: dict[str, Any] = {}
    with _LazyTensors(path) as source:

        def head_is_embedding(rows: int = 4096) -> bool:
            head, emb = source.slice("lm_head.weight"), source.slice("model.embed_tokens.weight")
            total = source.shape("lm_head.weight")[0]
            return all(
                np.array_equal(head[i : i + rows], emb[i : i + rows]) for i in range(0, total, rows)
            )

        shapes = {name: source.shape(name) for name in source.names}
        layout = hf_layout.check_tensors(shapes, config, head_is_embedding)
        # Under scan_layers a parameter stacks one HF tensor per layer; a device reads
        # its block of each layer its slice of the [num_layers] axis covers.
        for param in hf_layout.params_of(layout, config):
            views, blocks = [source.slice(e.hf_name) for e in param.entries], {}
            place = shardings
            for key in param.path:
                place = place[key]

            def block(index, param=param, views=views, blocks=blocks):
                key = tuple(s.indices(n) for s, n in zip(index, param.shape))
                if key not in blocks:
                    blocks[key] = np.ascontiguousarray(param.read_block(views, index), dtype=target)
                return blocks[key]

            hf_layout.set_path(
                params, param.path, jax.make_array_from_callback(param.shape, place, block)
            )
    return config, params


def shard_params(params, config: model_lib.ModelConfig, mesh, rules=sharding.DEFAULT_RULES):
    """Places plain params on the mesh with the shardings their logical axes get under
    `rules` (as `train_step.init_train_state` does for the train state)."""
    dummy = jnp.zeros((1, 1), jnp.int32)
    abstract = jax.eval_shape(
        lambda: model_lib.Transformer(config).init(jax.random.key(0), dummy, dummy)
    )["params"]
    return jax.device_put(params, sharding.params_shardings(mesh, abstract, rules))


# Files a tokenizer directory may hold that transformers' AutoTokenizer reads.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)
GENERATION_CONFIG_NAME = "generation_config.json"


def save_safetensors(tensors: Mapping[str, np.ndarray], path: str, *, like: str) -> None:
    """Writes tensors as a safetensors file with the permissions of the file `like` beside
    it: safetensors creates its files readable by their owner alone (0600), where the rest
    of an export, written with open(), is as readable as the user's umask allows."""
    from safetensors.numpy import save_file

    save_file(dict(tensors), path, metadata={"format": "pt"})
    os.chmod(path, os.stat(like).st_mode & 0o777)


def save_pretrained(
    path: str,
    config: model_lib.ModelConfig,
    params,
    max_shard_bytes: int | None = None,
    *,
    tokenizer_dir: str | None = None,
    generation: Mapping[str, Any] | None = None,
) -> list[str]:
    """Writes config.json and the weights (in the params' dtype) in the HF layout, and with
    `tokenizer_dir` the tokenizer too, so that transformers' AutoModelForCausalLM and
    AutoTokenizer load the directory.

    With max_shard_bytes, tensors are packed in order into model-0000i-of-0000n.safetensors
    files of at most that size (a larger tensor gets a file of its own) plus
    model.safetensors.index.json; otherwise (or if everything fits) one model.safetensors.
    Stale weight files of an earlier save in `path` are removed.
    tokenizer_dir: its TOKENIZER_FILES that exist are copied, and generation_config.json is
    written: the directory's own, if any, with the bos / pad / stop ids of
    `hf_tokenizer.HFTokenizer(tokenizer_dir)`. `generation` entries are written over it.
    Returns the files written.
    """
    hf_config = config_to_hf(config)
    tensors = hf_layout.params_to_hf(params, config)
    if tensors:
        dtype = str(next(iter(tensors.values())).dtype)
        hf_config["dtype"] = hf_config["torch_dtype"] = dtype
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name, x in tensors.items():
        if max_shard_bytes is not None and shards[-1] and size + x.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = x
        size += x.nbytes
    if len(shards) == 1:
        names = [WEIGHTS_NAME]
    else:
        names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]

    os.makedirs(path, exist_ok=True)
    for stale in os.listdir(path):
        if (stale in (WEIGHTS_NAME, INDEX_NAME) or _SHARD_RE.match(stale)) and stale not in names:
            os.remove(os.path.join(path, stale))
    with open(os.path.join(path, CONFIG_NAME), "w") as f:
        json.dump(hf_config, f, indent=2)
    for name, shard in zip(names, shards):
        save_safetensors(shard, os.path.join(path, name), like=os.path.join(path, CONFIG_NAME))
    written = [CONFIG_NAME, *names]
    if len(shards) > 1:
        index = {
            "metadata": {"total_size": sum(x.nbytes for x in tensors.values())},
            "weight_map": {k: name for name, shard in zip(names, shards) for k in shard},
        }
        with open(os.path.join(path, INDEX_NAME), "w") as f:
            json.dump(index, f, indent=2)
        written.append(INDEX_NAME)

    gen = None
    if tokenizer_dir is not None:
        from replax.text import hf_tokenizer

        tok = hf_tokenizer.HFTokenizer(tokenizer_dir)
        for name in TOKENIZER_FILES:
            source = os.path.join(tokenizer_dir, name)
            if os.path.isfile(source) and os.path.abspath(source) != os.path.abspath(
                os.path.join(path, name)
            ):
                shutil.copyfile(source, os.path.join(path, name))
                written.append(name)
        gen = generation_config(tok, tok.generation_config)
    if generation:
        gen = {**(gen or {}), **generation}
    if gen is not None:
        with open(os.path.join(path, GENERATION_CONFIG_NAME), "w") as f:
            json.dump(gen, f, indent=2)
        written.append(GENERATION_CONFIG_NAME)
    return written
