"""End to end on the CPU: RL with replay from a Hugging Face checkpoint on GSM8K.

A tiny random Qwen2.5-shaped checkpoint (151,936-row vocabulary, Qwen3's real
tokenizer.json with Qwen2.5's chat template; tests/checkpoints.py) and a slice of the
real GSM8K test set (tests/assets.py), trained by scripts/train.py with configs/gsm8k.py:
a few replay steps, a checkpoint, a resume, and an export. An entropy bonus makes every
step move the weights (the random policy's rewards are all 0, so the policy-gradient
term alone gives none): the export must hold the trained params of the step it names,
not the initial ones, and transformers must load it and decode it as replax decodes the
trained params. On 4 devices (the config's fsdp mesh over all of them) with 2 microbatches
of one row a device: the mesh and the microbatch paths in one run."""

import json
import os
import subprocess
import sys

import assets
import jax
import numpy as np
import pytest
import xla_flags
from checkpoints import write_qwen_style_tokenizer, write_tiny_qwen25
from micro_run import read

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# R = 2 x 4 = 8, B = 8, N = 16: the 4 devices divide every batch and microbatch. The
# data: the first GSM8K test questions whose chat prompts fit MAX_PROMPT tokens, 24 to
# train and 8 held out.
MAX_PROMPT, NUM_TRAIN, NUM_TEST = 128, 24, 8
TINY = [
    f"--config.model.max_len={MAX_PROMPT + 16}",
    "--config.model.dtype=float32",
    f"--config.rollout.max_prompt_len={MAX_PROMPT}",
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
    "--config.loss.entropy_coef=0.01",
    # Keep the all-zero-reward groups in the buffer, for the entropy bonus to train on.
    "--config.replay.drop_zero_advantage=false",
]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    pytest.importorskip("tokenizers")
    root = tmp_path_factory.mktemp("qwen")
    tokenizer = write_qwen_style_tokenizer(root / "tokenizer")
    write_tiny_qwen25(root / "model", tokenizer)
    return root / "model"


@pytest.fixture(scope="module")
def data(checkpoint, tmp_path_factory):
    """A directory with train.jsonl and test.jsonl: real GSM8K test records."""
    from replax.tasks.math import GSM8K_INSTRUCTION
    from replax.text.hf_tokenizer import HFTokenizer
    from replax.text.tokenizer import format_prompt

    tokenizer = HFTokenizer(str(checkpoint))
    fits = [
        r
        for r in assets.read_jsonl(assets.gsm8k("test"))[:200]
        if len(tokenizer.encode(format_prompt(tokenizer, f"{r['question']}\n{GSM8K_INSTRUCTION}")))
        <= MAX_PROMPT
    ]
    assert len(fits) >= NUM_TRAIN + NUM_TEST
    directory = tmp_path_factory.mktemp("gsm8k")
    for name, records in (("train", fits[:NUM_TRAIN]), ("test", fits[NUM_TRAIN:][:NUM_TEST])):
        with open(directory / f"{name}.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
    return directory


DEVICES = xla_flags.with_devices(4)


def train(workdir, checkpoint, data, *extra):
    env = {
        **os.environ,
        "XLA_FLAGS": DEVICES,
        "JAX_PLATFORMS": "cpu",
    }
    cmd = [
        sys.executable,
        "scripts/train.py",
        "--config=configs/gsm8k.py:qwen2.5-0.5b-instruct",
        f"--workdir={workdir}",
        f"--config.model.checkpoint={checkpoint}",
        f"--config.task.data_path={data}",
        *TINY,
        # The config's layer scan, remat, chunked log-probs and bfloat16 sampler stay on;
        # B = 8 in 2 microbatches of 4 rows, one a device.
        "--config.train.num_microbatches=2",
        "--config.train.logits_chunk_size=32",
        *extra,
    ]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)


def export(workdir, out, *extra):
    proc = subprocess.run(
        [sys.executable, "scripts/export.py", f"--workdir={workdir}", f"--out={out}", *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "XLA_FLAGS": DEVICES},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def trained_params(workdir, step, config):
    """The params of checkpoint `step`, read with orbax alone (not replax's restore), as
    HF-named tensors."""
    import orbax.checkpoint as ocp

    from replax.hf import layout as hf_layout

    path = os.path.join(workdir, "checkpoints", str(step), "train_state")
    with ocp.StandardCheckpointer() as reader:
        state = reader.restore(path)
    params = state["params"]
    return hf_layout.params_to_hf(params.get("params", params), config)


def test_replay_steps_checkpoint_resume_and_export(tmp_path, checkpoint, data):
    workdir = tmp_path / "run"
    first = train(workdir, checkpoint, data, "--config.total_steps=2")
    assert first.returncode == 0, first.stderr[-3000:]
    resumed = train(workdir, checkpoint, data, "--config.total_steps=4")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from step 2" in resumed.stdout + resumed.stderr
    # The run's task (from the configuration it saved) reads the real slice, split as the
    # files are, and scores each real solution 1 against its reference and 0 against the
    # next problem's (what the rewards of a trained policy would rest on).
    from replax.config import build as configuration
    from replax.config import spec as spec_lib
    from replax.tasks.answers import gsm8k_reference

    with open(workdir / "config.json") as f:
        spec = spec_lib.parse(json.load(f))
    task = configuration.make_task(
        spec.task, configuration.make_tokenizer(spec.tokenizer, spec.model)
    )
    for split, count in (("train", NUM_TRAIN), ("test", NUM_TEST)):
        solutions = [r["answer"] for r in assets.read_jsonl(data / f"{split}.jsonl")]
        answers = [e.answer for e in task.examples(split, 0)]
        assert answers == [gsm8k_reference(s) for s in solutions] and len(answers) == count
        assert [task.reward(s, a) for s, a in zip(solutions, answers)] == [1.0] * count
        wrong = [task.reward(s, a) for s, a in zip(solutions, answers[1:] + answers[:1])]
        assert sum(wrong) <= 1, wrong
    records = read(workdir)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert sorted(os.listdir(workdir / "checkpoints")) == ["2", "4"]
    for r in records:
        # Completions stop at a stop id or the length limit; no token past the tokenizer.
        assert 0 < r["gen_tokens"] <= r["gen_rollouts"] * 16
        assert 0.0 <= r["reward_mean"] <= 1.0
    assert "eval_accuracy" in records[1] and "eval_accuracy" in records[3]

    # Export of steps 2 and 4: each the params of its own checkpoint, and both moved from
    # the initial checkpoint.
    from safetensors.numpy import load_file

    from replax.hf import checkpoint as hf

    out = export(workdir, tmp_path / "hf")
    out2 = export(workdir, tmp_path / "hf2", "--step=2")
    assert {"config.json", "tokenizer.json", "generation_config.json"} <= set(os.listdir(out))
    initial = load_file(str(checkpoint / "model.safetensors"))
    exported, exported2 = (load_file(str(d / "model.safetensors")) for d in (out, out2))
    config = hf.read_config(str(out), scan_layers=True)
    trained, trained2 = (trained_params(workdir, step, config) for step in (4, 2))
    assert set(exported) == set(initial) == set(trained)
    for name in initial:
        np.testing.assert_array_equal(exported[name], trained[name], err_msg=name)
        np.testing.assert_array_equal(exported2[name], trained2[name], err_msg=name)
        assert np.abs(exported[name] - initial[name]).max() > 1e-5, name
        assert np.abs(exported[name] - exported2[name]).max() > 1e-5, name

    # transformers loads the export and decodes greedily as replax decodes it.
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    from replax.sampling import sampler as sampler_lib
    from replax.text.hf_tokenizer import HFTokenizer
    from replax.text.tokenizer import encode_prompts

    tokenizer = HFTokenizer(str(out))
    question = assets.read_jsonl(data / "test.jsonl")[0]["question"]
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}])
    ids, mask = encode_prompts(tokenizer, [prompt], MAX_PROMPT)
    config, params = hf.load_pretrained(str(out), max_len=MAX_PROMPT + 16)
    ours = sampler_lib.make_sampler(
        config,
        sampler_lib.SamplingConfig(temperature=0.0),
        max_prompt_len=MAX_PROMPT,
        max_new_tokens=12,
        stop_ids=tokenizer.stop_ids,
        pad_id=tokenizer.pad_id,
        vocab_size=tokenizer.sample_limit,
    ).generate(params, ids, mask, jax.random.key(0))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    transformers.AutoTokenizer.from_pretrained(str(out))  # loads (its ids: tests/hf/test_parity.py)
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
