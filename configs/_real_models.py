"""Shared parts of configs/gsm8k.py and configs/math.py: RL with experience replay on a
real instruct model loaded from a local Hugging Face directory.

A variant is a comma-separated list of at most one part of each kind, in any order:
  model      qwen2.5-0.5b-instruct, qwen2.5-1.5b-instruct (default), qwen2.5-7b-instruct,
             qwen3-0.6b, qwen3-1.7b, llama-3.2-1b-instruct
  algorithm  replay (default): R fresh rollouts per step, batch B = 2R drawn from a FIFO
             buffer of N = 8R (y = B/R = 2, x = N/R = 8), positive-bias sampling;
             onpolicy: N = B = R = 2R_replay (each rollout trained on once), half the
             steps, so both variants generate the same rollouts
  hardware   host (default): one TPU host (v5e-8), the policy and the optimizer state
             sharded over all its chips (mesh (1, -1, 1)); chip: one 16 GiB chip (Colab's
             v5e-1) for the 0.5B / 0.6B models: 32 microbatches, Adam's moments in
             bfloat16;
             pod: a pod slice, mesh (-1 data, fsdp, 1) with fsdp sized for the model,
             R = 512 (replay) fresh rollouts per step
e.g. `configs/gsm8k.py:qwen3-0.6b,onpolicy,pod`. Config files load this module by path
(ml_collections loads them by path, so they are not a package).
"""

from typing import Any, NamedTuple

import ml_collections
from ml_collections import config_dict

from replax.core.config_utils import ConfigError, load_sibling
from replax.tasks import math as math_task

# The RL sections shared with configs/arith.py.
common = load_sibling(__file__, "_common.py")


class Model(NamedTuple):
    """A named policy: its Hugging Face repository, architecture and RL settings."""

    # The Hugging Face Hub repository whose snapshot model.checkpoint points to.
    repo: str
    # ModelConfig fields of the real architecture (its config.json); with a checkpoint the
    # checkpoint's own config.json is used, these document it and serve shape checks.
    architecture: dict[str, Any]
    # Completions per prompt (the paper's G = 16; 8 keeps R small for small models).
    group_size: int
    # Adam's constant rate, the same for replay and on-policy.
    learning_rate: float
    # The fsdp size of the pod mesh: enough chips to hold params and Adam state.
    pod_fsdp: int
    # Appended to the task instruction (Qwen3's soft switch to turn thinking off).
    instruction_suffix: str = ""
    # On a host, decode tensor-parallel over this many chips (sampler mesh (-1, 1, t): the
    # weights and the KV cache split by head, never gathered); 1 decodes on the training
    # mesh. Where the fsdp layout's decode step moves more than 1.3x the bytes it must
    # read: the 7B's partial sums, Qwen3-1.7B's 2,048-position cache (docs/tpu.md).
    host_decode_tensor: int = 1


def _qwen2(vocab, d_model, layers, heads, kv_heads, mlp, tie):
    return dict(
        vocab_size=vocab,
        num_layers=layers,
        d_model=d_model,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=d_model // heads,
        mlp_dim=mlp,
        tie_embeddings=tie,
        qkv_bias=True,
        qk_norm=False,
        rope_theta=1_000_000.0,
        rope_type="default",
        norm_eps=1e-6,
    )


def _qwen3(d_model, layers, mlp):
    return dict(
        vocab_size=151_936,
        num_layers=layers,
        d_model=d_model,
        num_heads=16,
        num_kv_heads=8,
        head_dim=128,
        mlp_dim=mlp,
        tie_embeddings=True,
        qkv_bias=False,
        qk_norm=True,
        rope_theta=1_000_000.0,
        rope_type="default",
        norm_eps=1e-6,
    )


_LLAMA_3_2_1B = dict(
    vocab_size=128_256,
    num_layers=16,
    d_model=2048,
    num_heads=32,
    num_kv_heads=8,
    head_dim=64,
    mlp_dim=8192,
    tie_embeddings=True,
    qkv_bias=False,
    qk_norm=False,
    rope_theta=500_000.0,
    rope_type="llama3",
    rope_factor=32.0,
    rope_low_freq_factor=1.0,
    rope_high_freq_factor=4.0,
    rope_original_max_len=8192,
    norm_eps=1e-5,
)

# Qwen3 0.6B / 1.7B are hybrid thinking models; "/no_think" at the end of the user turn
# makes them answer directly, which fits the completion lengths below.
_NO_THINK = " /no_think"

MODELS = {
    "qwen2.5-0.5b-instruct": Model(
        "Qwen/Qwen2.5-0.5B-Instruct", _qwen2(151_936, 896, 24, 14, 2, 4864, True), 8, 3e-6, 4
    ),
    "qwen2.5-1.5b-instruct": Model(
        "Qwen/Qwen2.5-1.5B-Instruct", _qwen2(151_936, 1536, 28, 12, 2, 8960, True), 8, 2e-6, 8
    ),
    "qwen2.5-7b-instruct": Model(
        "Qwen/Qwen2.5-7B-Instruct",
        _qwen2(152_064, 3584, 28, 28, 4, 18944, False),
        16,
        1e-6,
        16,
        host_decode_tensor=4,
    ),
    "qwen3-0.6b": Model("Qwen/Qwen3-0.6B", _qwen3(1024, 28, 3072), 8, 3e-6, 4, _NO_THINK),
    "qwen3-1.7b": Model(
        "Qwen/Qwen3-1.7B", _qwen3(2048, 28, 6144), 8, 2e-6, 8, _NO_THINK, host_decode_tensor=8
    ),
    "llama-3.2-1b-instruct": Model("meta-llama/Llama-3.2-1B-Instruct", _LLAMA_3_2_1B, 8, 2e-6, 8),
}
ALGORITHMS = ("replay", "onpolicy")
HARDWARE = ("host", "chip", "pod")
DEFAULTS = {"model": "qwen2.5-1.5b-instruct", "algorithm": "replay", "hardware": "host"}
# Fresh rollouts per step of the replay variant, per hardware.
_REPLAY_R = {"host": 128, "chip": 128, "pod": 512}
# Replay ratio y = B / R and staleness horizon x = N / R of the replay variant.
REPLAY_Y, REPLAY_X = 2, 8


def parse_variant(arg: str | None) -> dict[str, str]:
    """'qwen3-0.6b,onpolicy,pod' -> {'model': ..., 'algorithm': ..., 'hardware': ...}."""
    kinds = {"model": tuple(MODELS), "algorithm": ALGORITHMS, "hardware": HARDWARE}
    chosen = dict(DEFAULTS)
    seen = set()
    for part in (arg or "").split(","):
        part = part.strip().lower()
        if not part:
            continue
        kind = next((k for k, allowed in kinds.items() if part in allowed), None)
        if kind is None:
            allowed = "; ".join(f"{k} {', '.join(v)}" for k, v in kinds.items())
            raise ConfigError(f"config variant part {part!r}: allowed are {allowed}")
        if kind in seen:
            raise ConfigError(
                f"config variant {arg!r} names two {kind}s: allowed is one of {kinds[kind]}"
            )
        seen.add(kind)
        chosen[kind] = part
    return chosen


def _model_section(model: Model, *, max_len: int) -> ml_collections.ConfigDict:
    """The model section of a named model: its architecture, numerics and start."""
    # The policy: model.architecture documents the named model; with model.checkpoint its
    # config.json gives the architecture; max_len, the dtypes and the layer settings apply.
    m = ml_collections.ConfigDict()
    for key, value in model.architecture.items():
        m[key] = value
    # Longest prompt + completion: the KV cache and positions (not the model's 32k+).
    m.max_len = max_len
    # Master weights and Adam state in float32; matmuls and activations in bfloat16.
    m.param_dtype = "float32"
    m.dtype = "bfloat16"
    # Layers under one nn.scan (compile time does not grow with depth), each recomputed in
    # the backward pass ('full' keeps only its input; 'save_dots' also its matmul outputs,
    # faster and larger; 'none').
    m.scan_layers = True
    m.remat_policy = "full"
    # 'dot_product' (jax.nn.dot_product_attention), 'splash' (the Pallas TPU kernel: set it
    # on TPU) or 'einsum' (the reference).
    m.attention = "dot_product"
    # LoRA (docs/lora.md): adapters of this rank train, the base stays frozen; 0 trains
    # every weight. lora_targets: comma-separated among q, k, v, o, gate, up, down.
    m.lora_rank = 0
    m.lora_alpha = 16.0
    m.lora_targets = "q,k,v,o,gate,up,down"
    # Start from the weights of model.checkpoint, a local Hugging Face directory
    # (config.json, *.safetensors, tokenizer files): a snapshot of the model's Hub
    # repository (MODELS[name].repo), passed with --config.model.checkpoint=DIR.
    m.init = "checkpoint"
    m.checkpoint = ""
    return m


def _task_section(task: str, model: Model) -> ml_collections.ConfigDict:
    """The task section: local GSM8K / MATH data, prompts through the chat template."""
    # The task: local GSM8K / MATH data, prompts through the model's chat template.
    t = ml_collections.ConfigDict()
    t.name = task
    # A JSONL or parquet file, a directory with train.jsonl / test.jsonl (or parquet),
    # or a saved `datasets` DatasetDict (its train and test splits). Required.
    t.data_path = config_dict.placeholder(str)
    # Held-out file; unset: data_path's test split (or a hashed test_fraction of one file).
    t.test_path = config_dict.placeholder(str)
    t.test_fraction = 0.1
    # 'instruct' (chat template; every model here is a chat model), 'base' or 'plain'.
    t.prompt_format = "instruct"
    # Unset: the chat template's default system turn (Qwen2.5: "You are Qwen, ...").
    t.system_prompt = config_dict.placeholder(str)
    # The instruction after the question; unset: the field's standard one (GSM8K: verl's
    # 'output the final answer after "####"', MATH: Qwen2.5-Math's "\boxed{}").
    instruction = math_task.GSM8K_INSTRUCTION if task == "gsm8k" else math_task.MATH_INSTRUCTION
    if model.instruction_suffix:
        t.instruction = instruction + model.instruction_suffix
    else:
        t.instruction = config_dict.placeholder(str)
    # How answers are compared: 'builtin' (replax's normaliser) or 'math_verify' (the
    # math-verify package: pip install 'replax[math_verify]').
    t.grader = "builtin"
    # Few-shot exemplars of the 'base' format (unused by 'instruct').
    t.num_shots = 4
    # Examples of each split written to the dataset; 0: all of the file's.
    t.num_train = 0
    t.num_test = 0
    t.data_seed = 0
    # Where the tokenized dataset is built; empty means WORKDIR/data.
    t.data_dir = ""
    # A prompt longer than rollout.max_prompt_len: 'error' (exit 2 before any compute, naming
    # the longest) or 'skip' (left out of the data set, counted and reported).
    t.long_prompts = "error"
    return t


def get_config(
    task: str,
    arg: str | None,
    *,
    max_prompt_len: int,
    max_new_tokens: int,
    host_steps: int,
    pod_steps: int,
) -> ml_collections.ConfigDict:
    """The run's config for `task` ('gsm8k' or 'math') and variant `arg`; the lengths and
    the replay variant's step counts (on-policy takes half) come from the task's file."""
    variant = parse_variant(arg)
    pod = variant["hardware"] == "pod"
    model = MODELS[variant["model"]]
    chip = variant["hardware"] == "chip"
    c = make_config(
        task,
        model,
        onpolicy=variant["algorithm"] == "onpolicy",
        replay_rollouts=_REPLAY_R[variant["hardware"]],
        replay_steps=pod_steps if pod else host_steps,
        max_prompt_len=max_prompt_len,
        max_new_tokens=max_new_tokens,
        mesh_shape=(-1, model.pod_fsdp, 1) if pod else (1, -1, 1),
        num_microbatches={"host": 8, "chip": 32, "pod": 4}[variant["hardware"]],
    )
    if variant["hardware"] == "host" and model.host_decode_tensor > 1:
        c.rollout.mesh_shape = (-1, 1, model.host_decode_tensor)
    if chip:
        # One 16 GiB chip (Colab's v5e-1) holds the 0.5B's float32 weights and Adam state
        # only with the moments in bfloat16, 8 sequences a microbatch and 128-position
        # log-prob chunks: 13.1 GiB at the train step by the TPU compiler (docs/tpu.md).
        c.train.logits_chunk_size = 128
        c.optimizer.state_dtype = "bfloat16"
    return c


def make_config(
    task: str,
    model: Model,
    *,
    onpolicy: bool,
    replay_rollouts: int,
    replay_steps: int,
    max_prompt_len: int,
    max_new_tokens: int,
    mesh_shape: tuple[int, int, int],
    num_microbatches: int,
) -> ml_collections.ConfigDict:
    """The config of one real-model run: `model` on `task` ('gsm8k' or 'math'), the replay
    variant's R = replay_rollouts and step count, or on-policy's (R = B = N = y R_replay,
    half the steps: the same generated rollouts). Other config files (configs/smollm2.py)
    build on it and change what their hardware or task needs."""
    r, steps = replay_rollouts, replay_steps
    # Evaluate 10 times and checkpoint 5 times a run, whatever its length.
    eval_every, checkpoint_every = steps // 10, steps // 5
    if onpolicy:  # R = B: twice the fresh rollouts a step, half the steps, same rollouts
        r, steps = REPLAY_Y * r, steps // 2
        eval_every, checkpoint_every = eval_every // 2, checkpoint_every // 2

    c = ml_collections.ConfigDict()
    common.run_keys(c, total_steps=steps, checkpoint_every=checkpoint_every)

    c.model = _model_section(model, max_len=max_prompt_len + max_new_tokens)

    # The checkpoint's tokenizer.json, chat template and stop ids (tokenizer.path: another
    # directory; empty means model.checkpoint).
    c.tokenizer = common.tokenizer("hf")

    # Device mesh (data, fsdp, tensor). Host: params, Adam state, batch and buffer split
    # over every chip. Pod: fsdp chips hold one copy of the state, -1 copies take the rest.
    c.mesh = common.mesh(tuple(mesh_shape))

    c.task = _task_section(task, model)

    # Supervised warm start: unused (model.init='checkpoint'); kept for the config checks.
    c.warmstart = ml_collections.ConfigDict()
    c.warmstart.min_accuracy = 0.0
    c.warmstart.max_accuracy = 1.0
    c.warmstart.max_steps = 1
    c.warmstart.batch_size = 8
    c.warmstart.learning_rate = 1e-5
    c.warmstart.eval_every = 1
    c.warmstart.num_examples = 0
    c.warmstart.cache_dir = ""

    # R = 128 (host) or 512 (pod) fresh rollouts a step for replay, twice that on-policy;
    # G completions of each prompt.
    # Decoding weights and KV cache in bfloat16, resharded from training's fp32 FSDP
    # layout once per generation onto rollout.mesh_shape.
    c.rollout = common.rollout(
        prompts_per_step=r // model.group_size,
        group_size=model.group_size,
        max_prompt_len=max_prompt_len,
        max_new_tokens=max_new_tokens,
        dtype="bfloat16",
        cache_dtype="bfloat16",
    )
    # B = 2R (replay) or R (on-policy); gradient accumulation over 8 (host) or 4 (pod)
    # microbatches inside the compiled step, and log-probs and entropy 256 positions at a
    # time: never [B, T, vocab] logits.
    c.train = common.train(
        batch_size=r if onpolicy else REPLAY_Y * r,
        num_microbatches=num_microbatches,
        logits_chunk_size=256,
    )
    c.optimizer = common.optimizer(learning_rate=model.learning_rate)
    # replay: N = 8R, the paper's positive-bias sampling, groups with equal rewards not
    # stored; onpolicy: N = R, each rollout exactly once, every group stored.
    c.replay = common.replay(
        capacity=r if onpolicy else REPLAY_X * r,
        strategy="uniform_no_replacement" if onpolicy else "positive_bias",
        drop_zero_advantage=not onpolicy,
    )
    c.loss = common.loss()
    # Greedy pass@1 on the first 256 test problems, pass@8 on 64, ten times a run; at most
    # R rows decoded at a time (the rollouts' batch, whose KV cache already fits: pass@8's
    # 512 rows at once do not fit Qwen3's KV cache on a v5e chip).
    c.eval = common.evaluation(every=eval_every, num_prompts=256)
    c.eval.max_rows = r
    return c
