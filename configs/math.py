r"""RL with experience replay on MATH, from a real instruct model's Hugging Face weights.

The paper's headline setting is this task (Qwen2.5-7B on MATH: the same final accuracy
with up to 40% less total compute than on-policy).
Policy: an instruct model loaded from a local Hugging Face directory (model.checkpoint):
Qwen2.5-0.5B / 1.5B (default) / 7B-Instruct, Qwen3-0.6B / 1.7B (thinking turned off by
"/no_think" in the prompt) or Llama-3.2-1B-Instruct; bfloat16 compute, float32 master
weights and Adam state. Task: competition mathematics (MATH: algebra, counting, geometry,
number theory, ...) from local files (task.data_path), prompted through the model's chat
template with Qwen2.5-Math's "Please reason step by step, and put your final answer within
\boxed{}."; reward 1 when the completion's last \boxed{} equals the reference answer after
the MATH / Minerva normalisation (fractions, units, LaTeX spacing; numbers compared as
numbers). Algorithm: group advantages (r - mean) / std over G completions per prompt and
behaviour log-probs, both frozen at generation; PPO-clip 0.2 with dual clip 3, no KL;
Adam at a constant rate. Buffer (replay): FIFO ring buffer of N = 8R rollouts, B = 2R
drawn per step with the paper's positive-bias sampling (delta 0.5; replay ratio y = B/R
= 2, staleness horizon x = N/R = 8); groups with equal rewards are not stored.
On-policy: N = B = R, each rollout trained on once.

Variants (comma-separated parts, any order; defaults qwen2.5-1.5b-instruct, replay, host):
those of configs/gsm8k.py, whose docstring's table gives each model's G, lr, host and pod
replay R / B / N and fsdp, the steps of replay and onpolicy, the hardware and the TPU
targets; they hold here as written. On MATH, onpolicy's generated rollouts are 8,000
problems at G = 8 on a host, about one epoch of the 7,500 training problems. Prompts up to
1024 tokens, completions up to 1024, temperature 1.
Evaluation: greedy pass@1 on the first 256 test problems and pass@8 on 64, every tenth
of the run (MATH-500 as the test split works: 256 <= 500), at most R rows decoded at a
time (eval.max_rows).

Memory: the train step accumulates gradients over train.num_microbatches slices of the
batch (8 on a host, 4 on a pod), keeps the layers under one nn.scan and recomputes each in
the backward pass (model.remat_policy 'full'), and takes log-probs and entropy 256
positions at a time (train.logits_chunk_size), so it never holds [B, T, vocab] logits;
docs/tpu.md has the TPU compiler's figures for every program of these configs on their
targets (Qwen2.5-7B, 256 sequences of 2048 tokens a step on a v5p-128, 128-position
chunks: 9.6 GiB a chip).
Expected (estimates, not measured: replax has not yet been run on these models): for
the default on a v5e-8, about twice a GSM8K step (sequences twice as long), roughly 4
hours for 500 steps. The starting models' MATH accuracy as their authors report it (own
prompts): Qwen2.5-Instruct 0.5B 34%, 1.5B 55%, 7B 76%; Llama-3.2-1B-Instruct 31%; the
base accuracy measured here will differ. The held-out accuracy is expected to rise by a
few points, and replay to get there with less compute than on-policy (the paper: up to
40% less for Qwen2.5-7B; scripts/compare.py measures it).

Data: a saved `datasets` DatasetDict with train and test splits of MATH records (problem /
solution, optionally answer), a directory with train.jsonl and test.jsonl, or one file
plus --config.task.test_path (e.g. MATH-500). A problem longer than 1024 tokens stops
the run (prompts are never truncated): drop such problems or raise
rollout.max_prompt_len and model.max_len. The model: a snapshot of the Hub repository,
e.g. `hf download Qwen/Qwen2.5-7B-Instruct --local-dir /path/Qwen2.5-7B`.

  python scripts/train.py --config=configs/math.py:qwen2.5-7b-instruct,pod \
      --workdir=runs/math --config.model.checkpoint=/path/Qwen2.5-7B \
      --config.task.data_path=/path/math/train.jsonl \
      --config.task.test_path=/path/math/test.jsonl
"""

from replax.core.config_utils import load_sibling


def get_config(arg=None):
    return load_sibling(__file__, "_real_models.py").get_config(
        "math",
        arg,
        # MATH problems with the chat template mostly fit in 400 tokens, a few (Asymptote
        # figures) run longer; solutions of these models take 300-900.
        max_prompt_len=1024,
        max_new_tokens=1024,
        # Replay steps (on-policy takes half): about one epoch of MATH's 7,500 training
        # problems on a host at G = 8.
        host_steps=500,
        pod_steps=200,
    )
