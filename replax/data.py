"""Datasets on disk (TFDS builders writing ArrayRecord, no TensorFlow) and grain pipelines.

Two builders, both with splits train / test and text features `prompt` and `answer`:
  ReplaxArith   the embedded arithmetic task (replax.tasks.arith), one builder config
                per difficulty and size; `prepare_arith` makes and prepares one.
  Gsm8kJsonl    local GSM8K-format train.jsonl / test.jsonl from a manual dir;
                `prepare_gsm8k` prepares it.
Records keep generation (file) order, so the first k test records are the same k
prompts every time. `builder.as_data_source(split)` is a random-access source of
{"prompt": bytes, "answer": bytes}, which `prompt_dataset` turns into batches of
left-padded prompt ids.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
from collections.abc import Sequence
from typing import Any

import grain
import numpy as np
import tensorflow_datasets as tfds
from etils import epath

from replax.tasks import arith
from replax.tasks.math import read_gsm8k_jsonl
from replax.tokenizer import Tokenizer, encode_prompts

_FEATURES = {"prompt": tfds.features.Text(), "answer": tfds.features.Text()}
FILE_FORMAT = "array_record"


class _LocalBuilder(tfds.core.GeneratorBasedBuilder):
    """Base of replax's builders (abstract, so tfds does not register it)."""

    # tfds 4.9.10 derives code_path through `importlib_resources`, which it does not
    # install on Python >= 3.9; the path only serves to find a checksums file (none).
    code_path = epath.Path(__file__)


# -- Arithmetic ------------------------------------------------------------------


@dataclasses.dataclass(eq=False)
class ArithConfig(tfds.core.BuilderConfig):
    """One arithmetic dataset: a difficulty, split sizes and a generation seed."""

    difficulty: arith.ArithDifficulty = arith.HARD
    num_train: int = 20_000
    num_test: int = 1_000
    seed: int = 0
    test_fraction: float = 0.1


def arith_config(
    difficulty: str | arith.ArithDifficulty = "hard",
    *,
    num_train: int = 20_000,
    num_test: int = 1_000,
    seed: int = 0,
    test_fraction: float = 0.1,
) -> ArithConfig:
    """A config whose name encodes every parameter, so cached data always matches."""
    if isinstance(difficulty, str):
        if difficulty not in arith.DIFFICULTIES:
            raise ValueError(
                f"difficulty must be one of {sorted(arith.DIFFICULTIES)} or an "
                f"ArithDifficulty, got {difficulty!r}"
            )
        difficulty = arith.DIFFICULTIES[difficulty]
    if num_train < 1 or num_test < 1:
        raise ValueError(f"num_train and num_test must be >= 1, got {num_train}, {num_test}")
    params = json.dumps([dataclasses.asdict(difficulty), test_fraction], sort_keys=True)
    digest = hashlib.sha256(params.encode()).hexdigest()[:8]
    return ArithConfig(
        name=f"{difficulty.name}_{digest}_train{num_train}_test{num_test}_seed{seed}",
        description=f"{difficulty}, test_fraction={test_fraction}",
        difficulty=difficulty,
        num_train=num_train,
        num_test=num_test,
        seed=seed,
        test_fraction=test_fraction,
    )


class ReplaxArith(_LocalBuilder):
    """Procedurally generated integer arithmetic ("37+48-19=" -> "66")."""

    VERSION = tfds.core.Version("1.0.0")
    BUILDER_CONFIGS = [arith_config("easy"), arith_config("hard")]

    def _info(self) -> tfds.core.DatasetInfo:
        # DatasetInfo(builder=self, ...) directly: `dataset_info_from_configs` looks
        # for metadata files of a registered package, which replax is not.
        return tfds.core.DatasetInfo(
            builder=self,
            description=self.builder_config.description,
            features=tfds.features.FeaturesDict(_FEATURES),
            disable_shuffling=True,
        )

    def _split_generators(self, dl_manager):
        del dl_manager
        config = self.builder_config
        return {
            "train": self._generate_examples("train", config.num_train),
            "test": self._generate_examples("test", config.num_test),
        }

    def _generate_examples(self, split: str, num: int):
        config = self.builder_config
        task = arith.ArithTask(config.difficulty, test_fraction=config.test_fraction)
        for i, example in enumerate(task.examples(split, num, config.seed)):
            yield i, {"prompt": example.prompt, "answer": example.answer}


def prepare_arith(
    data_dir: str | pathlib.Path,
    difficulty: str | arith.ArithDifficulty = "hard",
    **config_kwargs: Any,
) -> ReplaxArith:
    """Generates (once) and returns the arithmetic dataset under data_dir.

    config_kwargs: num_train, num_test, seed, test_fraction (see `arith_config`).
    """
    config = arith_config(difficulty, **config_kwargs)
    if config.name in ReplaxArith.builder_configs:  # tfds wants predefined ones by name
        config = config.name
    builder = ReplaxArith(data_dir=str(data_dir), config=config, file_format=FILE_FORMAT)
    builder.download_and_prepare()
    return builder


# -- GSM8K-format JSONL -------------------------------------------------------------


class Gsm8kJsonl(_LocalBuilder):
    """GSM8K-format problems from local files (prompt = question, answer = after ####)."""

    VERSION = tfds.core.Version("1.0.0")
    MANUAL_DOWNLOAD_INSTRUCTIONS = """\
    Put train.jsonl and test.jsonl in the manual dir, one JSON object a line:
    {"question": "...", "answer": "... #### 42"} (the format of openai/grade-school-math).
    """
    FILES = {"train": "train.jsonl", "test": "test.jsonl"}

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description="GSM8K-format JSONL files from a local directory.",
            features=tfds.features.FeaturesDict(_FEATURES),
            disable_shuffling=True,
        )

    def _split_generators(self, dl_manager):
        try:
            manual_dir = pathlib.Path(dl_manager.manual_dir)
        except AssertionError as e:  # tfds: "Manual directory X does not exist or is empty"
            raise FileNotFoundError(str(e)) from None
        paths = {split: manual_dir / name for split, name in self.FILES.items()}
        for path in paths.values():
            if not path.is_file():
                raise FileNotFoundError(f"{path} not found in manual dir {manual_dir}")
        return {split: self._generate_examples(path) for split, path in paths.items()}

    def _generate_examples(self, path: pathlib.Path):
        for i, example in enumerate(read_gsm8k_jsonl(path)):
            yield i, {"prompt": example.prompt, "answer": example.answer}


def prepare_gsm8k(data_dir: str | pathlib.Path, manual_dir: str | pathlib.Path) -> Gsm8kJsonl:
    """Reads manual_dir/{train,test}.jsonl into ArrayRecord under data_dir (once).

    Once prepared, later calls reuse data_dir and no longer read manual_dir.
    """
    builder = Gsm8kJsonl(data_dir=str(data_dir), file_format=FILE_FORMAT)
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(manual_dir=str(manual_dir))
    )
    return builder


# -- Grain pipelines -----------------------------------------------------------------


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def prompt_dataset(
    source: Sequence[dict[str, Any]],
    tokenizer: Tokenizer,
    *,
    max_prompt_len: int,
    batch_size: int,
    seed: int,
    shuffle: bool = True,
    repeat: bool = True,
    drop_remainder: bool = True,
) -> grain.MapDataset:
    """Batches of tokenized prompts from a random-access source of {"prompt", "answer"}.

    Each batch is a dict of numpy arrays:
      prompt_ids   int32[B, P]  BOS + prompt tokens, left-padded with pad_id
      prompt_mask  bool[B, P]   True on real tokens
      answer       str[B]       reference answers (numpy unicode)
      index        int64[B]     record index in `source`
    With shuffle, each epoch is a fresh permutation determined by `seed`.
    `iter(dataset)` is checkpointable: `get_state()` / `set_state(state)` (a small
    JSON-able dict), or `grain.checkpoint.CheckpointSave/CheckpointRestore` in orbax.
    Raises ValueError (at iteration) for a prompt longer than max_prompt_len.
    """
    num_records = len(source)
    if num_records == 0:
        raise ValueError("prompt_dataset: the source is empty")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")

    def tokenize(index: int, record: dict[str, Any]) -> dict[str, np.ndarray]:
        ids, mask = encode_prompts(tokenizer, [_text(record["prompt"])], max_prompt_len)
        return {
            "prompt_ids": ids[0],  # [P]
            "prompt_mask": mask[0],  # [P]
            "answer": np.asarray(_text(record["answer"])),
            # Beyond the first epoch grain passes the global position.
            "index": np.int64(index % num_records),
        }

    dataset = grain.MapDataset.source(source).map_with_index(tokenize)
    if shuffle:
        dataset = dataset.shuffle(seed=seed)
    if repeat:
        dataset = dataset.repeat()  # a new permutation each epoch
    return dataset.batch(batch_size, drop_remainder=drop_remainder)


def eval_examples(source: Sequence[dict[str, Any]], num: int) -> list[tuple[str, str]]:
    """The first `num` (prompt, answer) pairs of `source`, as str, in record order."""
    if num > len(source):
        raise ValueError(f"asked for {num} eval examples, the source has {len(source)}")
    return [(_text(source[i]["prompt"]), _text(source[i]["answer"])) for i in range(num)]
