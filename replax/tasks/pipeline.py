"""Datasets on disk (a TFDS builder writing ArrayRecord, no TensorFlow) and grain pipelines.

`prepare_task_data(data_dir, task, ...)` writes a task's train and test splits once, as
text features `prompt` and `answer`, with the `ReplaxTask` builder; any `replax.tasks.Task`
works, the embedded arithmetic and a user's own alike. The builder config's name holds a
digest of the task's `data_key()` and the split sizes and seed, so cached data always
matches the task that asked for it. Records keep generation (file) order, so the first k
test records are the same k prompts every time. `builder.as_data_source(split)` is a
random-access source of {"prompt": bytes, "answer": bytes}, which `prompt_dataset` turns
into batches of left-padded prompt ids.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import pathlib
from collections.abc import Sequence
from typing import Any

import grain
import jax
import numpy as np
import tensorflow_datasets as tfds
from etils import epath
from tensorflow_datasets.core.utils import tqdm_utils

from replax.core import processes
from replax.core.config_utils import ConfigError
from replax.tasks.base import Task
from replax.text.tokenizer import Tokenizer, encode_prompts

FILE_FORMAT = "array_record"


@dataclasses.dataclass(eq=False)
class TaskDataConfig(tfds.core.BuilderConfig):
    """One dataset: a task, split sizes and the seed its examples are drawn with."""

    task: Task | None = None
    num_train: int = 0
    num_test: int = 0
    seed: int = 0


def task_data_config(task: Task, *, num_train: int, num_test: int, seed: int) -> TaskDataConfig:
    """A config whose name encodes everything the examples depend on. A size of 0 takes
    every example a file-backed task has."""
    if num_train < 0 or num_test < 0:
        raise ValueError(f"num_train and num_test must be >= 0, got {num_train}, {num_test}")
    digest = hashlib.sha256(json.dumps([task.name, task.data_key()]).encode()).hexdigest()[:8]
    return TaskDataConfig(
        name=f"{task.name}_{digest}_train{num_train}_test{num_test}_seed{seed}",
        description=repr(task),
        task=task,
        num_train=num_train,
        num_test=num_test,
        seed=seed,
    )


class ReplaxTask(tfds.core.GeneratorBasedBuilder):
    """The examples of a `replax.tasks.Task`, split train / test."""

    VERSION = tfds.core.Version("1.0.0")
    # tfds 4.9.10 derives code_path through `importlib_resources`, which it does not
    # install on Python >= 3.9; the path only serves to find a checksums file (none).
    code_path = epath.Path(__file__)

    def _info(self) -> tfds.core.DatasetInfo:
        # DatasetInfo(builder=self, ...) directly: `dataset_info_from_configs` looks
        # for metadata files of a registered package, which replax is not.
        return tfds.core.DatasetInfo(
            builder=self,
            description=self.builder_config.description,
            features=tfds.features.FeaturesDict(
                {"prompt": tfds.features.Text(), "answer": tfds.features.Text()}
            ),
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
        for i, example in enumerate(config.task.examples(split, num, config.seed)):
            yield i, {"prompt": example.prompt, "answer": example.answer}

    # tfds prints "Downloading and preparing dataset Unknown size ..." before and "Dataset
    # ... downloaded and prepared" after a build; replax downloads nothing (the examples
    # are generated or read locally), so the lines would only mislead, offline above all.
    def _log_download_bytes(self) -> None:
        pass

    def _log_download_done(self) -> None:
        pass


@contextlib.contextmanager
def _quiet_tfds():
    """tfds's progress bars and its info and warning lines ("Using custom data
    configuration ...") off while replax builds its data; errors still show, and
    exceptions propagate as they are."""
    absl_logger = logging.getLogger("absl")
    level = absl_logger.level
    absl_logger.setLevel(logging.ERROR)
    active = tqdm_utils._active
    tfds.display_progress_bar(False)
    try:
        yield
    finally:
        tfds.display_progress_bar(active)
        absl_logger.setLevel(level)


def prepare_task_data(
    data_dir: str | pathlib.Path, task: Task, *, num_train: int, num_test: int, seed: int = 0
) -> ReplaxTask:
    """Writes (once) and returns the task's dataset under data_dir.

    With several processes, process 0 writes it while the others wait; they then read
    what it wrote (or, on a disk of their own, write their own copy)."""
    config = task_data_config(task, num_train=num_train, num_test=num_test, seed=seed)

    def make_and_prepare():
        with _quiet_tfds():
            builder = ReplaxTask(data_dir=str(data_dir), config=config, file_format=FILE_FORMAT)
            builder.download_and_prepare()
        return builder

    if jax.process_index() == 0:
        try:
            builder = make_and_prepare()
        except BaseException:
            processes.from_process_zero(np.int32(1))  # the others stop too
            raise
        processes.from_process_zero(np.int32(0))  # the others wait for this
        return builder
    if processes.from_process_zero(np.int32(0)):
        raise ConfigError(f"process 0 could not prepare the data in {data_dir}: see its output")
    return make_and_prepare()  # made now: a builder reads what is on disk when it is made


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
    block: tuple[int, int] = (0, 1),
) -> grain.MapDataset:
    """Batches of tokenized prompts from a random-access source of {"prompt", "answer"}.

    Each batch is a dict of numpy arrays:
      prompt_ids   int32[B, P]  BOS + prompt tokens, left-padded with pad_id
      prompt_mask  bool[B, P]   True on real tokens
      answer       str[B]       reference answers (numpy unicode)
      prompt_text  str[B]       the prompts as text (numpy unicode)
      index        int64[B]     record index in `source`
    With shuffle, each epoch is a fresh permutation determined by `seed`.
    block=(i, n): each batch is the i-th of n equal blocks of rows of the global batch of
    batch_size, so that n processes each read their own block of the same global order.
    `iter(dataset)` is checkpointable: `get_state()` / `set_state(state)` (a small
    JSON-able dict), or `grain.checkpoint.CheckpointSave/CheckpointRestore` in orbax.
    Raises ValueError (at iteration) for a prompt longer than max_prompt_len.
    """
    num_records = len(source)
    if num_records == 0:
        raise ValueError("prompt_dataset: the source is empty")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    index, count = block
    if batch_size % count or not 0 <= index < count:
        raise ValueError(f"block={block}: batch_size={batch_size} has no block {index} of {count}")

    def tokenize(index: int, record: dict[str, Any]) -> dict[str, np.ndarray]:
        ids, mask = encode_prompts(tokenizer, [_text(record["prompt"])], max_prompt_len)
        return {
            "prompt_ids": ids[0],  # [P]
            "prompt_mask": mask[0],  # [P]
            "answer": np.asarray(_text(record["answer"])),
            # The prompt as text: a reward function by config (task.reward) takes it.
            "prompt_text": np.asarray(_text(record["prompt"])),
            # Beyond the first epoch grain passes the global position.
            "index": np.int64(index % num_records),
        }

    dataset = grain.MapDataset.source(source).map_with_index(tokenize)
    if shuffle:
        dataset = dataset.shuffle(seed=seed)
    if repeat:
        dataset = dataset.repeat()  # a new permutation each epoch
    if count == 1:
        return dataset.batch(batch_size, drop_remainder=drop_remainder)
    # Global batch k is blocks [k n, (k + 1) n) of the rows cut in blocks.
    return dataset.batch(batch_size // count, drop_remainder=drop_remainder)[index::count]


def eval_examples(source: Sequence[dict[str, Any]], num: int) -> list[tuple[str, str]]:
    """The first `num` (prompt, answer) pairs of `source`, as str, in record order."""
    if num > len(source):
        raise ValueError(f"asked for {num} eval examples, the source has {len(source)}")
    return [(_text(source[i]["prompt"]), _text(source[i]["answer"])) for i in range(num)]
