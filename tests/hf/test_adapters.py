"""LoRA against transformers and peft themselves (torch, CPU): a tiny random Qwen2 / Llama
written by transformers is loaded by replax with adapters (A and B both random, so they
change the logits), and
- the PEFT adapter replax writes (`adapters.save_peft`, scripts/export.py --adapter_only),
  put on the transformers base by `peft.PeftModel.from_pretrained`, gives replax's logits;
- the merged export (`lora.merged` + `hf.save_pretrained`, scripts/export.py) loaded by
  transformers alone gives them too.

Needs the `parity` extra (torch, transformers, peft); skipped without them.
"""

import dataclasses
import json
import os

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from test_parity import _hf_model, _logits, _random_model, _tokens, _torch_logits  # noqa: E402

from replax.hf import adapters  # noqa: E402
from replax.hf import checkpoint as hf  # noqa: E402
from replax.model import lora  # noqa: E402
from replax.model import transformer as model_lib  # noqa: E402

TOL = 1e-4


def _with_random_adapters(config, params, seed=0):
    """params with adapters of config's rank, A and B drawn (B is zero at a real init)."""
    tokens = np.zeros((1, 4), np.int32)
    full = jax.tree.map(
        np.asarray,
        model_lib.nn.unbox(
            model_lib.Transformer(config).init(jax.random.key(seed), tokens, tokens)
        )["params"],
    )
    adapters = lora.partition(full, True)[0]
    rng = np.random.default_rng(seed)
    adapters = jax.tree.map(lambda x: (rng.normal(size=x.shape) * 0.3).astype(np.float32), adapters)
    return lora.combine(adapters, params)


@pytest.mark.parametrize(
    "name, targets", [("qwen2_untied", "q,k,v,o,gate,up,down"), ("llama", "q,v,down")]
)
def test_peft_and_merged_exports_give_replaxs_logits(tmp_path, name, targets):
    base_dir = tmp_path / "base"
    _random_model(name).save_pretrained(base_dir)
    config, params = hf.load_pretrained(
        str(base_dir), max_len=24, lora_rank=4, lora_alpha=8.0, lora_targets=targets
    )
    params = _with_random_adapters(config, params)
    tokens = _tokens(2, (2, 24))
    mask = np.ones_like(tokens, dtype=bool)
    mask[1, :5] = False  # a left-padded row
    adapted = _logits(config, params, tokens, mask)
    base_logits = _logits(lora.base_config(config), lora.without_adapters(params), tokens, mask)
    assert np.abs(adapted - base_logits).max() > 0.1  # the adapters change the model

    # The PEFT adapter on the transformers base.
    adapter_dir = tmp_path / "adapter"
    written = adapters.save_peft(str(adapter_dir), params, config, base_model=str(base_dir))
    assert sorted(written) == ["adapter_config.json", "adapter_model.safetensors"]
    with open(adapter_dir / "adapter_config.json") as f:
        saved = json.load(f)
    assert saved["r"] == 4 and saved["lora_alpha"] == 8.0
    assert saved["target_modules"] == [adapters.HF_MODULES[t][1] for t in config.lora_targets]
    names = set(adapters.to_peft(params, config))
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in names
    peft_model = peft.PeftModel.from_pretrained(_hf_model(base_dir), str(adapter_dir)).eval()
    # Every adapter replax wrote was taken up (none silently left at PEFT's init).
    loaded = {k for k in peft_model.state_dict() if "lora_" in k}
    assert len(loaded) == len(names) == 2 * 2 * len(config.lora_targets)
    got = _torch_logits(peft_model, tokens, mask)
    valid = mask[:, :, None]
    peft_diff = float(np.abs(np.where(valid, got - adapted, 0)).max())
    assert peft_diff < TOL, peft_diff

    # The merged export, without peft.
    merged_dir = tmp_path / "merged"
    hf.save_pretrained(str(merged_dir), lora.base_config(config), lora.merged(params, config))
    got = _torch_logits(_hf_model(merged_dir), tokens, mask)
    merged_diff = float(np.abs(np.where(valid, got - adapted, 0)).max())
    assert merged_diff < TOL, merged_diff
    print(
        f"\n{name} ({targets}): |peft - replax| {peft_diff:.1e}, "
        f"|merged - replax| {merged_diff:.1e}"
    )


def test_a_scanned_models_adapters_export_as_the_unrolled_ones(tmp_path):
    base_dir = tmp_path / "base"
    _random_model("qwen2_untied").save_pretrained(base_dir)
    config, params = hf.load_pretrained(str(base_dir), max_len=24, lora_rank=2)
    params = _with_random_adapters(config, params)
    scanned = dataclasses.replace(config, scan_layers=True)
    n = config.num_layers
    stacked = model_lib.stack_layers(params, n)
    unrolled, stacked_out = adapters.to_peft(params, config), adapters.to_peft(stacked, scanned)
    assert unrolled.keys() == stacked_out.keys()
    for k in unrolled:
        np.testing.assert_array_equal(unrolled[k], stacked_out[k])


def test_the_adapter_files_are_readable_like_the_rest(tmp_path):
    """safetensors creates its files 0600; adapter_model.safetensors gets the mode of
    adapter_config.json beside it."""
    base_dir = tmp_path / "base"
    _random_model("llama").save_pretrained(base_dir)
    config, params = hf.load_pretrained(str(base_dir), max_len=24, lora_rank=2, lora_targets="q")
    params = _with_random_adapters(config, params)
    previous = os.umask(0o022)
    try:
        written = adapters.save_peft(str(tmp_path / "adapter"), params, config)
    finally:
        os.umask(previous)
    modes = {name: os.stat(tmp_path / "adapter" / name).st_mode & 0o777 for name in written}
    assert modes == {"adapter_config.json": 0o644, "adapter_model.safetensors": 0o644}
