"""A run whose data set has one prompt longer than rollout.max_prompt_len, through a tiny
Hugging Face tokenizer's chat template; also its config file.

  python scripts/train.py --config=tests/long_prompts.py:DIR --workdir=RUN

DIR holds what `write(DIR)` writes: tokenizer/ (a word-level tokenizer.json, one token a
word, with a ChatML template and Qwen's special tokens, no BOS) and gsm8k/ (train.jsonl,
9 GSM8K-style records, and test.jsonl, 8). Every chat prompt is 7 tokens of template and
instruction plus its question's words: the questions have 5 words, 12 tokens in all,
except train record 4's 30 (37 tokens), over MAX_PROMPT_LEN = 16.
"""

import json
import os

import ml_collections

from replax.core.config_utils import load_module

_HERE = os.path.dirname(os.path.abspath(__file__))
MAX_PROMPT_LEN = 16
LONG_INDEX = 4
LONG_QUESTION = "a farmer has " + " ".join(["many"] * 26) + " apples"  # 30 words
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
WORDS = ["user", "assistant", "how", "many", "apples", "are", "left", "a", "farmer", "has"]


def _questions(split: str) -> list[tuple[str, str]]:
    n = 9 if split == "train" else 8
    records = [("how many apples are left", str(i)) for i in range(n)]
    if split == "train":
        records[LONG_INDEX] = (LONG_QUESTION, "99")
    return records


def write(directory: str) -> str:
    """Writes the tokenizer and the data under directory; returns it."""
    import tokenizers

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    vocab = {t: i for i, t in enumerate([*specials, "[UNK]", *WORDS, "Answer", "."])}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.add_special_tokens(specials)
    tokenizer_dir = os.path.join(directory, "tokenizer")
    os.makedirs(tokenizer_dir, exist_ok=True)
    tok.save(os.path.join(tokenizer_dir, "tokenizer.json"))
    config = {
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "chat_template": CHATML,
    }
    with open(os.path.join(tokenizer_dir, "tokenizer_config.json"), "w") as f:
        json.dump(config, f)
    data_dir = os.path.join(directory, "gsm8k")
    os.makedirs(data_dir, exist_ok=True)
    for split in ("train", "test"):
        with open(os.path.join(data_dir, f"{split}.jsonl"), "w") as f:
            for question, answer in _questions(split):
                f.write(json.dumps({"question": question, "answer": f"#### {answer}"}) + "\n")
    return directory


def get_config(arg=None):
    """configs/arith.py's micro policy and loop (R = 8, B = 16, N = 32: the 8 simulated
    devices divide every batch) on GSM8K-style data in the directory `arg`."""
    c = load_module(os.path.join(os.path.dirname(_HERE), "configs", "arith.py")).get_config()
    c.model.update(
        dict(num_layers=1, d_model=32, num_heads=2, num_kv_heads=1, head_dim=16, mlp_dim=64)
    )
    c.model.init = "random"
    c.tokenizer.name = "hf"
    c.tokenizer.path = os.path.join(arg or "", "tokenizer")
    c.task = ml_collections.ConfigDict()
    c.task.name = "gsm8k"
    c.task.data_path = os.path.join(arg or "", "gsm8k")
    c.task.prompt_format = "instruct"
    c.task.instruction = "Answer."
    c.task.num_train = 0
    c.task.num_test = 0
    c.task.data_seed = 0
    c.task.data_dir = ""
    c.task.long_prompts = "error"
    c.rollout.update(dict(prompts_per_step=2, group_size=4, max_prompt_len=MAX_PROMPT_LEN))
    c.train.batch_size = 16
    c.replay.capacity = 32
    c.eval.update(dict(num_prompts=8, pass_k=2, pass_k_prompts=4, every=1))
    c.total_steps = 1
    c.checkpoint_every = 1
    return c
