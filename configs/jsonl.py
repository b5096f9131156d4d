r"""RL with experience replay on your own prompts and answers (a JSONL file), scored by
your own reward function.

Policy, algorithm, buffer and hardware: those of configs/arith.py (a 1.0M-parameter
byte-level decoder warm-started by SFT on the answers of the file's train records, all of
them, until it solves 30-40% of held-out prompts; GRPO-style group advantages, PPO-clip
against the behaviour log-probs; positive-bias replay of N = 4096), with its variants
`replay` (default) and `onpolicy`.
Task: `task.data_path`, a JSONL file with one {"prompt": ..., "answer": ...} record a line;
`task.test_fraction` of the records (chosen by a hash of the prompt, so stable) are
held out. Reward: `task.reward`, `path/to/file.py:FN` or `package.module:FN` with
FN(prompt, completion, answer) -> float, called on the host for each completion (an
exception scores 0 and is counted in metrics.jsonl's cumulative `reward_errors`); empty:
1.0 when the stripped completion, or its final answer, matches `answer`.
Hardware and time: as configs/arith.py's for prompts and answers of that size (a few
minutes on 2 CPU cores for a short file); larger models through --config.model.*. TPU
target: configs/arith.py's (v5e:2x2).
Sizes: 16 held-out prompts are evaluated, which a file of a few hundred lines holds; a
setting the file cannot hold exits 2 before anything is written, naming the key and a
value that fits.
Expected: held-out accuracy (mean reward of greedy completions) up from the warm start,
when the policy can learn the task from the file's records: 300 lines of copied digits
("417=" -> "417") go from 0.33 to 0.46 in 60 steps of a 0.1M-parameter policy
(tests/run/test_trainer.py); 300 lines of 3-digit sums are memorised, not learnt
(docs/reference.md#your-own-prompts): give such a task thousands of records or a real
model (--config.model.checkpoint).

  python scripts/train.py --config=configs/jsonl.py --workdir=runs/mine \
      --config.task.data_path=my_data.jsonl --config.task.reward=my_reward.py:reward
"""

import ml_collections

from replax.core.config_utils import load_sibling


def get_config(arg=None):
    c = load_sibling(__file__, "arith.py").get_config(arg)
    c.task = ml_collections.ConfigDict()
    c.task.name = "jsonl"
    # The JSONL file of {"prompt", "answer"} records (required).
    c.task.data_path = ""
    # FN(prompt, completion, answer) -> float as 'path/to/file.py:FN' or
    # 'package.module:FN'; empty: exact match of the (final) answer.
    c.task.reward = ""
    # The fraction of records held out for evaluation, chosen by a hash of the prompt.
    c.task.test_fraction = 0.1
    # Records used of each split: 0 takes all of them.
    c.task.num_train = 0
    c.task.num_test = 0
    c.task.data_seed = 0
    # Directory of TFDS-built data; empty means WORKDIR/data.
    c.task.data_dir = ""
    # A prompt longer than rollout.max_prompt_len: 'error' (exit 2) or 'skip'.
    c.task.long_prompts = "error"
    # The warm start's demonstrations: the first num_examples train records (0: all).
    c.warmstart.num_examples = 0
    # The held-out prompts evaluated, at most the file's test records: 16 fit a file of a
    # few hundred lines (about 20 held out of 200); raise it for a larger file, the more
    # prompts the steadier the accuracy (a multiple of the data shards, as for arith).
    c.eval.num_prompts = 16
    c.eval.pass_k_prompts = 16
    return c
