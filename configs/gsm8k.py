r"""RL with experience replay on GSM8K, from a real instruct model's Hugging Face weights.

Policy: an instruct model loaded from a local Hugging Face directory (model.checkpoint):
Qwen2.5-0.5B / 1.5B (default) / 7B-Instruct, Qwen3-0.6B / 1.7B (thinking turned off by
"/no_think" in the prompt) or Llama-3.2-1B-Instruct; bfloat16 compute, float32 master
weights and Adam state. Task: GSM8K grade-school word problems from local files
(task.data_path), prompted through the model's chat template with "Let's think step by
step and output the final answer after "####"."; reward 1 when the completion's final
answer (after its last "####", else its last \boxed{}, else its last number) equals the
reference. Algorithm: group advantages (r - mean) / std over G completions per prompt and
behaviour log-probs, both frozen at generation; PPO-clip 0.2 with dual clip 3, no KL;
Adam at a constant rate. Buffer (replay): FIFO ring buffer of N = 8R rollouts, B = 2R
drawn per step with the paper's positive-bias sampling (delta 0.5; replay ratio y = B/R
= 2, staleness horizon x = N/R = 8); groups with equal rewards are not stored.
On-policy: N = B = R, each rollout trained on once.

Variants (comma-separated parts, any order; defaults qwen2.5-1.5b-instruct, replay, host):
  model                   G  lr    | host replay R / B / N | pod replay R / B / N, fsdp
  qwen2.5-0.5b-instruct   8  3e-6  | 128 / 256 / 1024      | 512 / 1024 / 4096, 4
  qwen2.5-1.5b-instruct   8  2e-6  | 128 / 256 / 1024      | 512 / 1024 / 4096, 8
  qwen2.5-7b-instruct    16  1e-6  | 128 / 256 / 1024      | 512 / 1024 / 4096, 16
  qwen3-0.6b              8  3e-6  | 128 / 256 / 1024      | 512 / 1024 / 4096, 4
  qwen3-1.7b              8  2e-6  | 128 / 256 / 1024      | 512 / 1024 / 4096, 8
  llama-3.2-1b-instruct   8  2e-6  | 128 / 256 / 1024      | 512 / 1024 / 4096, 8
  replay (default) 500 steps on a host, 200 on a pod; onpolicy: R = B = N = 256 (host) or
  1024 (pod), half the steps (the same generated rollouts, about one GSM8K epoch at G = 8
  on a host). Prompts up to 512 tokens, completions up to 512, temperature 1.
  host (default): one TPU host, mesh (1, -1, 1) over its chips (a v5e-8's 16 GB chips
  hold the parameters and Adam state of up to the 1.7B models; the 7B needs a host with
  more memory, e.g. v5p-8 or v6e-8, or `pod`); on a host the 7B and Qwen3-1.7B decode
  tensor-parallel, rollout.mesh_shape (-1, 1, 4) and (-1, 1, 8): their decode steps then
  move about the bytes they must read (docs/tpu.md); pod: a pod slice, mesh (-1, fsdp, 1).
  TPU targets, compiled for by scripts/tpu_compile.py (docs/tpu.md): host on a v5e-8
  (--topology=v5e:2x4; the 7B on a v5p-8, v5p:2x2x1); chip (the 0.5B on one 16 GiB chip,
  Colab's v5e-1: 32 microbatches, Adam's moments in bfloat16) on v5e:1x1; pod on a
  v5e-16 (v5e:4x4; the 7B on a v5p-128, v5p:4x4x4).
Evaluation: greedy pass@1 on the first 256 test problems and pass@8 on 64, every tenth
of the run, at most R rows decoded at a time (eval.max_rows).

Memory: the train step accumulates gradients over train.num_microbatches slices of the
batch (8 on a host, 4 on a pod), keeps the layers under one nn.scan and recomputes each in
the backward pass (model.remat_policy 'full'), and takes log-probs and entropy 256
positions at a time (train.logits_chunk_size), so it never holds [B, T, vocab] logits;
docs/tpu.md has the TPU compiler's figures for every program of these configs on their
targets (Qwen2.5-7B, 256 sequences of 2048 tokens a step on a v5p-128, 128-position
chunks: 9.6 GiB a chip).
Expected (estimates, not measured: replax has not yet been run on these models): for
the default on a v5e-8, about 10-15 s a step (generation bandwidth-bound, training about
2.4 PFLOP a step), so roughly 2 hours for 500 steps. The starting models' GSM8K accuracy
as their authors report it (own prompts): Qwen2.5-Instruct 0.5B 50%, 1.5B 73%, 7B 92%;
Llama-3.2-1B-Instruct 44%; the base accuracy measured here (this prompt and answer check)
will differ. The held-out accuracy is expected to rise by a few points, and replay to get
there with fewer generated tokens than on-policy (the paper's claim; scripts/compare.py).

Data: a saved `datasets` DatasetDict of openai/gsm8k (`main`: train 7,473, test 1,319),
a directory with train.jsonl and test.jsonl (records with question / answer), or one file
plus --config.task.test_path. The model: a snapshot of the Hub repository, e.g.
`hf download Qwen/Qwen2.5-1.5B-Instruct --local-dir /path/Qwen2.5-1.5B-Instruct`.

  python scripts/train.py --config=configs/gsm8k.py:qwen2.5-1.5b-instruct \
      --workdir=runs/gsm8k --config.model.checkpoint=/path/Qwen2.5-1.5B-Instruct \
      --config.task.data_path=/path/gsm8k
"""

from replax.core.config_utils import load_sibling


def get_config(arg=None):
    return load_sibling(__file__, "_real_models.py").get_config(
        "gsm8k",
        arg,
        # GSM8K questions with the chat template fit in about 300 tokens; worked answers
        # of these models take 150-400.
        max_prompt_len=512,
        max_new_tokens=512,
        # Replay steps (on-policy takes half): about one GSM8K epoch on a host at G = 8.
        host_steps=500,
        pod_steps=200,
    )
