r"""RL with experience replay on the embedded arithmetic task (the default run).

Policy: a 1.0M-parameter byte-level Llama-style decoder (4 layers, d_model 128, GQA),
warm-started by SFT on worked answers until it solves 30-40% of held-out prompts (it
stops on measured accuracy; the base is cached). Task: 3-digit addition with carries
("764+996=" -> "1760", answers of 3 or 4 digits), exact-answer reward; the generator in
replax/tasks/arith.py also makes multi-term +, -, * problems (task.* keys). Algorithm:
GRPO-style group advantages and behaviour log-probs frozen at generation, PPO-clip 0.2
with dual clip 3 against the stored behaviour log-probs, Adam at a constant rate, no KL.
Buffer: FIFO ring buffer of N = 4096, the paper's positive-bias sampling (uniform over the
freshest N/2 rollouts and the freshest N/2 correct ones), zero-advantage groups not stored.
In the replay-vs-on-policy studies (docs/studies.md: x by y sweep, refinements, 3
seeds) positive bias with a large buffer won; N = 4096 at lr 1e-4 ended above N = 1024
on every seed, at the same inference and cost ratios, and gained 9 points more on this
run.
Hardware: 2 CPU cores, or 8 simulated CPU devices (the mesh takes every device).
Expected: about 15 minutes on 2 CPU cores including compilation and warm start; held-out greedy
accuracy up by more than 25 points over the warm start.

Variants:
  replay    (default) R = 2 x 8 fresh rollouts per step, batch B = 64 (replay ratio
            y = B/R = 4), capacity N = 4096 (x = N/R = 256), positive bias delta 0.5,
            lr 1e-4, 1600 steps (25,600 generated rollouts)
  onpolicy  N = B = R = 64 (each rollout used once), lr 1e-4, 400 steps (same rollouts)

  python scripts/train.py --config=configs/arith.py:replay --workdir=runs/arith
"""

import ml_collections

from replax.config_utils import parse_variant
from replax.sharding import DEFAULT_RULES

VARIANTS = ("replay", "onpolicy")


def get_config(arg=None):
    variant = parse_variant(arg, VARIANTS, default="replay")
    c = ml_collections.ConfigDict()
    # Seed of everything random: init, data order, sampling.
    c.seed = 0
    # RL steps (one optimizer step each).
    c.total_steps = 1600
    # Generated-rollout budget: when > 0 the run also stops once it has generated this
    # many rollouts (auto mode generates on some steps only). 0: steps alone decide.
    c.total_rollouts = 0

    # The policy: a small Llama-style decoder over bytes.
    c.model = ml_collections.ConfigDict()
    c.model.vocab_size = 264
    c.model.num_layers = 4
    c.model.d_model = 128
    c.model.num_heads = 4
    c.model.num_kv_heads = 2
    c.model.head_dim = 32
    c.model.mlp_dim = 512
    c.model.max_len = 32
    c.model.tie_embeddings = True
    c.model.qkv_bias = False
    c.model.qk_norm = False
    c.model.param_dtype = "float32"
    c.model.dtype = "float32"
    # Layers unrolled (True: under one nn.scan, for deep models), no recomputation in the
    # backward pass ('full' / 'save_dots' trade compute for memory), einsum attention
    # ('dot_product', or 'splash' on TPU).
    c.model.scan_layers = False
    c.model.remat_policy = "none"
    c.model.attention = "einsum"
    # The starting policy: 'warmstart' (supervised, below), 'random', or 'checkpoint'
    # (the weights of model.checkpoint, a local Hugging Face directory).
    c.model.init = "warmstart"
    c.model.checkpoint = ""

    # Text <-> token ids: 'byte' (one token per UTF-8 byte, plus BOS / EOS / pad) or 'hf'
    # (tokenizer.json and chat template of tokenizer.path, default model.checkpoint).
    c.tokenizer = ml_collections.ConfigDict()
    c.tokenizer.name = "byte"
    c.tokenizer.path = ""

    # Device mesh (data, fsdp, tensor); -1 takes the remaining devices.
    c.mesh = ml_collections.ConfigDict()
    c.mesh.shape = (-1, 1, 1)
    # Logical axis -> mesh axes (replax.sharding.DEFAULT_RULES: batch and buffer over
    # data x fsdp, embed over fsdp, heads / mlp / vocab over tensor).
    c.mesh.rules = DEFAULT_RULES

    # The verifiable-reward task and where its ArrayRecord data is built.
    c.task = ml_collections.ConfigDict()
    c.task.name = "arith"
    # RL distribution: number of operands and their digits.
    c.task.min_terms = 2
    c.task.max_terms = 2
    c.task.min_digits = 3
    c.task.max_digits = 3
    c.task.ops = "+"
    c.task.max_mul_operand = 9
    # Seed of the generated problems (fixed across run seeds: one held-out set).
    c.task.data_seed = 0
    c.task.num_train = 50_000
    c.task.num_test = 2_000
    # Directory of TFDS-built data; empty means WORKDIR/data.
    c.task.data_dir = ""

    # Warm start (model.init='warmstart'): SFT on worked answers until held-out accuracy,
    # measured on the eval.num_prompts evaluation prompts, is in [min, max]. From a
    # 30% base, RL's groups mostly carry signal; measured from an 18% base, replay and
    # on-policy both gained about 20 points in the same budget (docs/studies.md).
    c.warmstart = ml_collections.ConfigDict()
    c.warmstart.min_accuracy = 0.30
    c.warmstart.max_accuracy = 0.40
    c.warmstart.max_steps = 4000
    c.warmstart.batch_size = 64
    c.warmstart.learning_rate = 1e-3
    c.warmstart.eval_every = 25
    # Where the base checkpoint is cached; empty means WORKDIR/base. Runs that share a
    # seed and model can share one (scripts/compare.py does).
    c.warmstart.cache_dir = ""

    # Rollouts: R = prompts_per_step x group_size fresh completions per step.
    c.rollout = ml_collections.ConfigDict()
    c.rollout.prompts_per_step = 2
    c.rollout.group_size = 8
    c.rollout.max_prompt_len = 10
    c.rollout.max_new_tokens = 6
    c.rollout.temperature = 1.0
    c.rollout.top_k = 0
    c.rollout.top_p = 1.0
    # top-p looks for its cut among this many most likely tokens first (exact either way).
    c.rollout.top_p_candidates = 64
    # Decoding dtype of the weights and the KV cache ('': the model's compute dtype) and
    # the sampler's mesh (empty: the training mesh).
    c.rollout.dtype = ""
    c.rollout.cache_dtype = ""
    c.rollout.mesh_shape = ()

    # The learner: batch B of rollouts sampled from the buffer each step.
    c.train = ml_collections.ConfigDict()
    c.train.batch_size = 64
    # Gradient accumulation over this many slices of the batch inside the compiled step.
    c.train.num_microbatches = 1
    # Log-probs this many positions at a time (0: all at once).
    c.train.logits_chunk_size = 0

    c.optimizer = ml_collections.ConfigDict()
    c.optimizer.learning_rate = 1e-4
    c.optimizer.schedule = "constant"
    c.optimizer.warmup_steps = 0
    c.optimizer.weight_decay = 0.0
    c.optimizer.grad_clip = 1.0
    c.optimizer.b1 = 0.9
    c.optimizer.b2 = 0.999
    # Adam's moments' dtype.
    c.optimizer.state_dtype = "float32"

    # Replay store: FIFO ring buffer of capacity N.
    c.replay = ml_collections.ConfigDict()
    c.replay.mode = "fixed"  # 'fixed' or 'auto' (choose x = N/R and y = B/R online)
    c.replay.capacity = 4096
    c.replay.strategy = "positive_bias"
    c.replay.sample_mode = "local"
    # positive_bias: the freshest (1 - delta) N items and the freshest delta N correct ones.
    c.replay.delta = 0.5
    c.replay.recency_tau = 8.0
    c.replay.priority_alpha = 0.6
    c.replay.priority_beta = 0.4
    # 0 disables the age / reuse limits.
    c.replay.max_age = 0
    c.replay.max_reuse = 0
    # Groups whose rewards are all equal have zero advantage: do not store them.
    c.replay.drop_zero_advantage = True
    # mu for planning in auto mode; 0 means measure it on this machine.
    c.replay.mu = 0.0
    # Auto mode re-plans the generation period and the max age every this many steps.
    c.replay.auto_every = 10
    # Auto mode never plans a replay ratio y = B / R above this (it generates at least
    # every floor(auto_max_y R / B) steps).
    c.replay.auto_max_y = 8.0
    # How auto mode turns its estimates into (x, y): 'long_run' (J with the buffer noise
    # summed over the steps a rollout lives in: y* = sqrt(mu / (1/f + rho)), f the kept
    # fraction; replax/auto_replay.py derives it) or 'paper' (the paper's J as written,
    # which over-reuses on the embedded task: docs/auto_replay.md).
    c.replay.auto_design = "long_run"

    # The objective on (possibly stale) rollouts.
    c.loss = ml_collections.ConfigDict()
    c.loss.name = "ppo"
    c.loss.epsilon_low = 0.2
    c.loss.epsilon_high = 0.2
    c.loss.dual_clip = 3.0
    c.loss.rho_max = 2.0
    c.loss.asymre_delta_v = -0.1
    c.loss.m2po_tau = 0.04
    c.loss.kl_coef = 0.0
    c.loss.entropy_coef = 0.0
    c.loss.aggregation = "token_mean"
    # Group-normalised advantages: divide by the group's std (GRPO) or not (Dr.GRPO).
    c.loss.normalize_std = True

    # Held-out evaluation: greedy pass@1, pass@k at temperature 1, token entropy.
    c.eval = ml_collections.ConfigDict()
    c.eval.every = 50
    c.eval.num_prompts = 1024
    c.eval.pass_k = 8
    c.eval.pass_k_prompts = 64

    c.log_every = 1
    c.checkpoint_every = 100
    # Checkpoints kept (the newest); an unreadable newest one falls back to the previous.
    c.checkpoint_keep = 2

    if variant == "onpolicy":
        # Each fresh rollout is trained on exactly once: N = B = R, drawn as a permutation.
        c.total_steps = 400
        c.rollout.prompts_per_step = 8
        c.replay.capacity = 64
        c.replay.strategy = "uniform_no_replacement"
        c.optimizer.learning_rate = 1e-4
        c.replay.drop_zero_advantage = False
    return c
