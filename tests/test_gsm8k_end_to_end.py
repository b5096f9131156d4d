"""End to end on the CPU: RL with replay from a Hugging Face checkpoint on GSM8K.

A tiny random Qwen2.5-shaped checkpoint (151,936-row vocabulary, a real tokenizer.json
with Qwen2.5's chat template; tests/checkpoints.py) and tests/data/gsm8k_tiny.jsonl,
trained by scripts/train.py with configs/gsm8k.py: a few replay steps, a checkpoint, a
resume, an export that transformers loads and decodes like replax; on 1 device and on
the 8-device mesh."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from checkpoints import write_qwen_style_tokenizer, write_tiny_qwen25

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "gsm8k_tiny.jsonl")
# R = 2 x 4 = 8, B = 8, N = 16: the 8 devices divide every batch. Prompts through the chat
# template are up to 78 tokens of this tokenizer.
TINY = [
    "--config.model.max_len=112",
    "--config.model.dtype=float32",
    "--config.rollout.max_prompt_len=96",
    "--config.rollout.max_new_tokens=16",
    "--config.rollout.prompts_per_step=2",
    "--config.rollout.group_size=4",
    "--config.train.batch_size=8",
    "--config.replay.capacity=16",
    "--config.eval.num_prompts=8",
    "--config.eval.pass_k=2",
    "--config.eval.pass_k_prompts=4",
    "--config.eval.every=2",
    "--config.checkpoint_every=2",
    "--config.optimizer.learning_rate=1e-3",
]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    pytest.importorskip("tokenizers")
    root = tmp_path_factory.mktemp("qwen")
    tokenizer = write_qwen_style_tokenizer(root / "tokenizer")
    write_tiny_qwen25(root / "model", tokenizer)
    return root / "model"


def train(workdir, checkpoint, *extra, devices=8):
    env = {
        **os.environ,
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
        "JAX_PLATFORMS": "cpu",
    }
    cmd = [
        sys.executable,
        "scripts/train.py",
        "--config=configs/gsm8k.py:qwen2.5-0.5b-instruct",
        f"--workdir={workdir}",
        f"--config.model.checkpoint={checkpoint}",
        f"--config.task.data_path={DATA}",
        *TINY,
        # The config's layer scan, remat, chunked log-probs and bfloat16 sampler stay on;
        # B = 8 splits into 2 microbatches on one device, none on 8 (one row per device).
        f"--config.train.num_microbatches={2 if devices == 1 else 1}",
        "--config.train.logits_chunk_size=32",
        *extra,
    ]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)


def read(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


TIMING = ("wall_s", "gen_s", "train_s", "mu_measured")


def strip_timing(records):
    return [{k: v for k, v in r.items() if k not in TIMING} for r in records]


@pytest.mark.parametrize("devices", [1, 8])
def test_replay_steps_checkpoint_resume_and_export(tmp_path, checkpoint, devices):
    workdir = tmp_path / "run"
    first = train(workdir, checkpoint, "--config.total_steps=2", devices=devices)
    assert first.returncode == 0, first.stderr[-3000:]
    resumed = train(workdir, checkpoint, "--config.total_steps=4", devices=devices)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from step 2" in resumed.stdout + resumed.stderr
    records = read(workdir)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert sorted(os.listdir(workdir / "checkpoints")) == ["2", "4"]
    for r in records:
        # Completions stop at a stop id or the length limit; no token past the tokenizer.
        assert 0 < r["gen_tokens"] <= r["gen_rollouts"] * 16
        assert r["reward_errors"] == 0
    assert "eval_accuracy" in records[1] and "eval_accuracy" in records[3]

    # Export: transformers loads the directory and decodes greedily as replax does.
    out = tmp_path / "hf"
    proc = subprocess.run(
        [sys.executable, "scripts/export.py", f"--workdir={workdir}", f"--out={out}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {"config.json", "tokenizer.json", "generation_config.json"} <= set(os.listdir(out))
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    from replax import hf
    from replax import sampler as sampler_lib
    from replax.tokenizer import HFTokenizer, encode_prompts

    tokenizer = HFTokenizer(str(out))
    question = "Tom has 3 apples and buys 4 more. How many apples does he have?"
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}])
    ids, mask = encode_prompts(tokenizer, [prompt], 64)
    config, params = hf.load_pretrained(str(out), max_len=80)
    ours = sampler_lib.make_sampler(
        config,
        max_prompt_len=64,
        max_new_tokens=12,
        stop_ids=tokenizer.stop_ids,
        pad_id=tokenizer.pad_id,
        temperature=0.0,
        vocab_size=tokenizer.sample_limit,
    ).generate(params, ids, mask, jax.random.key(0))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    transformers.AutoTokenizer.from_pretrained(str(out))  # loads (its ids: tests/test_parity.py)
    prompt_ids = torch.tensor(np.asarray(ids)[0][np.asarray(mask)[0]][None].astype(np.int64))
    # Rows past the tokenizer's vocabulary are never sampled by replax: suppress them in
    # transformers' greedy decoding too.
    generated = model.generate(
        prompt_ids,
        max_new_tokens=12,
        do_sample=False,
        suppress_tokens=list(range(tokenizer.vocab_size, config.vocab_size)),
        eos_token_id=list(tokenizer.stop_ids),
        pad_token_id=tokenizer.pad_id,
    )[0, prompt_ids.shape[1] :].tolist()
    length = int(ours.lengths[0])
    assert length > 0
    assert np.asarray(ours.tokens)[0, :length].tolist() == generated[:length]
