"""The RL sections every config shares, as big_vision's configs/common.py serves its configs
(the leading underscore, as in _real_models.py: a module of configs, not a run).

configs/arith.py and configs/_real_models.py (hence gsm8k.py and math.py) build on these:
each function returns one section (or sets the run-wide keys) with the settings the
configs have in common, and takes as arguments the settings in which they differ. A
config file sets its own model, tokenizer and task sections. Config files are loaded by
path (ml_collections loads them so; configs/ is not a package): load this module with
`replax.core.config_utils.load_sibling(__file__, "_common.py")`.
"""

import ml_collections

from replax.core.sharding import DEFAULT_RULES


def run_keys(c: ml_collections.ConfigDict, *, total_steps: int, checkpoint_every: int) -> None:
    """The run-wide keys: seed, length, logging and checkpoints."""
    # Seed of everything random: init, data order, sampling.
    c.seed = 0
    # RL steps (one optimizer step each).
    c.total_steps = total_steps
    # Generated-rollout budget: when > 0 the run also stops once it has generated this
    # many rollouts (auto mode generates on some steps only). 0: steps alone decide.
    c.total_rollouts = 0
    c.log_every = 1
    c.checkpoint_every = checkpoint_every
    # Checkpoints kept (the newest); an unreadable newest one falls back to the previous.
    c.checkpoint_keep = 2
    c.log = ml_collections.ConfigDict()
    # Off a terminal (a log file, a batch job) a progress line at most this often, and at
    # the last step; 0: every step. A terminal gets a bar, a notebook a tqdm bar.
    c.log.print_every_s = 60.0
    # Also log to Weights & Biases (pip install -e '.[wandb]'): 'offline' writes
    # WORKDIR/wandb for `wandb sync`; 'online' sends as it goes.
    c.log.wandb = False
    c.log.wandb_mode = "offline"


def tokenizer(name: str) -> ml_collections.ConfigDict:
    """Text <-> token ids: 'byte' (one token per UTF-8 byte, plus BOS / EOS / pad) or 'hf'
    (tokenizer.json, chat template and stop ids of tokenizer.path)."""
    t = ml_collections.ConfigDict()
    t.name = name
    # Empty means model.checkpoint.
    t.path = ""
    return t


def mesh(shape: tuple[int, int, int]) -> ml_collections.ConfigDict:
    """The device mesh (data, fsdp, tensor); -1 takes the remaining devices."""
    m = ml_collections.ConfigDict()
    m.shape = shape
    # Logical axis -> mesh axes (replax.core.sharding.DEFAULT_RULES: batch and buffer over
    # data x fsdp, embed over fsdp, heads / mlp / vocab over tensor).
    m.rules = DEFAULT_RULES
    return m


def rollout(
    *,
    prompts_per_step: int,
    group_size: int,
    max_prompt_len: int,
    max_new_tokens: int,
    dtype: str = "",
    cache_dtype: str = "",
    slots: int = 0,
    refill_every: int = 4,
    drain_halvings: int = 0,
) -> ml_collections.ConfigDict:
    """Rollouts: R = prompts_per_step x group_size fresh completions per step."""
    r = ml_collections.ConfigDict()
    r.prompts_per_step = prompts_per_step
    r.group_size = group_size
    # Prompts are never truncated: a longer one stops the run with its text.
    r.max_prompt_len = max_prompt_len
    r.max_new_tokens = max_new_tokens
    r.temperature = 1.0
    r.top_k = 0
    r.top_p = 1.0
    # top-p looks for its cut among this many most likely tokens first (exact either way).
    r.top_p_candidates = 64
    # Decoding dtype of the weights and the KV cache ('': the model's compute dtype) and
    # the sampler's mesh (empty: the training mesh; e.g. (-1, 1, 2) decodes
    # tensor-parallel over pairs of chips).
    r.dtype = dtype
    r.cache_dtype = cache_dtype
    r.mesh_shape = ()
    # Where the sampler runs: 'colocated' (the trainer's devices; each step decodes, then
    # trains) or 'disjoint' (num_devices devices of its own, 0: half of them, generating
    # the next rollouts while the trainer steps; mesh.shape is then the trainer's mesh).
    # Disjoint: the sampler's weights are refreshed every sync_every train steps, and
    # fresh rollouts are at most max_policy_lag train steps behind the trainer.
    r.placement = "colocated"
    r.num_devices = 0
    r.sync_every = 1
    r.max_policy_lag = 1
    # The rollout engine (continuous batching): this many slots decode at once, a slot
    # whose completion stops taking the next queued (prompt, sample) every refill_every
    # decode steps. The KV cache is slots x (prompt + cap) whatever R is. 0: the static
    # sampler, all R rows decoded until the longest one stops.
    r.slots = slots
    r.refill_every = refill_every
    # After the first fill, at most this many slots take a rollout at one refill (0: every
    # free slot; a multiple of the sampler's data shards): a refill copies that many
    # prompt prefixes at most, rather than S.
    r.max_admit = 0
    # Once every queued rollout has a slot, the slots halve up to this many times as the
    # last rollouts come to fit, so the tail decodes in fewer rows (1.5x the slots' cache
    # while stepping down; 0: every slot decodes to the end).
    r.drain_halvings = drain_halvings
    # Disjoint placement through the engine: the slots stay full across generations and a
    # group goes to the trainer once its G completions are done (docs/placement.md).
    r.stream = False
    return r


def train(
    *, batch_size: int, num_microbatches: int = 1, logits_chunk_size: int = 0
) -> ml_collections.ConfigDict:
    """The learner: batch B of rollouts sampled from the buffer each step."""
    t = ml_collections.ConfigDict()
    t.batch_size = batch_size
    # Gradient accumulation over this many slices of the batch inside the compiled step:
    # B / M rows a pass, one update.
    t.num_microbatches = num_microbatches
    # Log-probs and entropy this many positions at a time (0: all at once, [B, T, vocab]).
    t.logits_chunk_size = logits_chunk_size
    # rollout.placement='disjoint': train steps per generation (replayed while the next
    # generation is in flight; the trainer waits for it after this many).
    t.max_steps_per_generation = 1
    return t


def optimizer(*, learning_rate: float) -> ml_collections.ConfigDict:
    """Adam at a constant rate, no weight decay (the paper's optimizer)."""
    o = ml_collections.ConfigDict()
    o.learning_rate = learning_rate
    o.schedule = "constant"
    o.warmup_steps = 0
    o.weight_decay = 0.0
    o.grad_clip = 1.0
    o.b1 = 0.9
    o.b2 = 0.999
    # Adam's first moment (float32; bfloat16 halves its memory).
    o.state_dtype = "float32"
    return o


def replay(*, capacity: int, strategy: str, drop_zero_advantage: bool) -> ml_collections.ConfigDict:
    """The replay store: a FIFO ring buffer of capacity N, sharded like the batch."""
    r = ml_collections.ConfigDict()
    r.mode = "fixed"  # 'fixed' or 'auto' (choose x = N/R and y = B/R online)
    r.capacity = capacity
    # 'positive_bias' (the paper's), 'uniform_no_replacement' (on-policy: each rollout
    # exactly once), 'uniform', 'recency' or 'priority'.
    r.strategy = strategy
    r.sample_mode = "local"
    # positive_bias: the freshest (1 - delta) N items and the freshest delta N correct ones.
    r.delta = 0.5
    r.recency_tau = 8.0
    r.priority_alpha = 0.6
    r.priority_beta = 0.4
    # 0 disables the age / reuse limits.
    r.max_age = 0
    r.max_reuse = 0
    # Groups whose rewards are all equal have zero advantage: do not store them.
    r.drop_zero_advantage = drop_zero_advantage
    # mu for planning in auto mode; 0 means measure it on this machine.
    r.mu = 0.0
    # Auto mode re-plans the generation period and the max age every this many steps.
    r.auto_every = 10
    # Auto mode never plans a replay ratio y = B / R above this (it generates at least
    # every floor(auto_max_y R / B) steps).
    r.auto_max_y = 8.0
    # How auto mode turns its estimates into (x, y): 'long_run' (J with the buffer noise
    # summed over the steps a rollout lives in: y* = sqrt(mu / (1/f + rho)), f the kept
    # fraction; replax/replay/auto.py derives it) or 'paper' (the paper's J as written,
    # which over-reuses on the embedded task: docs/auto_replay.md).
    r.auto_design = "long_run"
    # Auto mode never plans y below this. 1: down to on-policy (below B / R every step
    # generates and some train; at y = 1 each batch is B fresh rollouts, each trained on
    # once), which the design picks when mu is low; 0: never below B / R.
    r.auto_min_y = 1.0
    # The batch of auto mode's on-policy steps (y = 1), in replay batches: a step trains
    # once this many x train.batch_size fresh rollouts wait (in as many times the
    # microbatches, each of the replay step's size). Set it so that the batch is the
    # on-policy design's that auto stands in for at low mu.
    r.auto_onpolicy_batches = 1
    return r


def loss() -> ml_collections.ConfigDict:
    """PPO-clip 0.2 against the frozen behaviour log-probs, dual clip 3 (bounds the loss
    of stale rollouts with negative advantage), no KL, group-normalised advantages."""
    c = ml_collections.ConfigDict()
    c.name = "ppo"
    c.epsilon_low = 0.2
    c.epsilon_high = 0.2
    c.dual_clip = 3.0
    c.rho_max = 2.0
    c.asymre_delta_v = -0.1
    c.m2po_tau = 0.04
    c.kl_coef = 0.0
    c.entropy_coef = 0.0
    c.aggregation = "token_mean"
    # Group-normalised advantages: divide by the group's std (GRPO) or not (Dr.GRPO).
    c.normalize_std = True
    # Weight of positive-advantage rollouts in the loss (W-REINFORCE's lambda below 1).
    c.positive_weight = 1.0
    # The fraction of tokens, of largest positive log-prob x advantage covariance, whose
    # gradient is cut (0: off). At most one of the three covariance options is on.
    c.cov_cut_frac = 0.0
    # Clip-Cov (Cui et al. 2025): the fraction r of tokens drawn at random in the covariance
    # band (low, high) whose gradient is cut (0: off; the paper's r is 2e-4, band 1 to 5).
    c.clip_cov_ratio = 0.0
    c.clip_cov_low = 1.0
    c.clip_cov_high = 5.0
    # KL-Cov: coef x |log pi - log mu| on the fraction k of tokens of largest covariance
    # (0: off; the paper's k is 2e-3 at 7B, coef 1).
    c.kl_cov_frac = 0.0
    c.kl_cov_coef = 1.0
    return c


def evaluation(*, every: int, num_prompts: int) -> ml_collections.ConfigDict:
    """Held-out evaluation: greedy pass@1 on the first num_prompts test prompts, pass@k at
    temperature 1 on the first pass_k_prompts, token entropy."""
    e = ml_collections.ConfigDict()
    e.every = every
    e.num_prompts = num_prompts
    e.pass_k = 8
    e.pass_k_prompts = 64
    # The first this many held-out prompts, their greedy completions, rewards and answers
    # go to WORKDIR/samples.jsonl (and TensorBoard) at each evaluation.
    e.num_samples = 4
    # Rows decoded per call, 0: all greedy prompts at once, then all pass@k rows. A large
    # model sets it (to its R) so that evaluation's KV cache is no larger than generation's.
    e.max_rows = 0
    return e
