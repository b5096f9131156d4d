"""Tests for replax/tasks/pipeline.py: TFDS builders (ArrayRecord) and grain prompt pipelines."""

import json
import logging

import numpy as np
import pytest

from replax.tasks import arith
from replax.tasks import pipeline as data
from replax.text.tokenizer import ByteTokenizer, encode_prompts

NUM_TRAIN, NUM_TEST = 200, 50


@pytest.fixture(scope="module")
def arith_builder(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("data")
    task = arith.ArithTask(arith.EASY)
    return data.prepare_task_data(data_dir, task, num_train=NUM_TRAIN, num_test=NUM_TEST, seed=0)


def _batches(dataset, num):
    iterator = iter(dataset)
    return [next(iterator) for _ in range(num)]


def test_arith_builder_writes_array_record(arith_builder):
    files = sorted(p.name for p in arith_builder.data_path.iterdir())
    assert any(".array_record-" in name and "-train." in name for name in files)
    assert any(".array_record-" in name and "-test." in name for name in files)
    train = arith_builder.as_data_source("train")
    test = arith_builder.as_data_source("test")
    assert (len(train), len(test)) == (NUM_TRAIN, NUM_TEST)
    # Records keep generation order: the builder's test split is the task's test split.
    expected = arith.ArithTask(arith.EASY).examples("test", NUM_TEST, seed=0)
    assert data.eval_examples(test, NUM_TEST) == [(e.prompt, e.answer) for e in expected]
    train_prompts = {prompt for prompt, _ in data.eval_examples(train, NUM_TRAIN)}
    assert not train_prompts & {e.prompt for e in expected}


def test_builder_reuses_prepared_data_and_names_configs_by_what_the_examples_depend_on(
    arith_builder,
):
    again = data.prepare_task_data(
        arith_builder.data_dir.split("/replax_task")[0],
        arith.ArithTask(arith.EASY),
        num_train=NUM_TRAIN,
        num_test=NUM_TEST,
        seed=0,
    )
    assert again.data_path == arith_builder.data_path
    easy, hard = arith.ArithTask(arith.EASY), arith.ArithTask(arith.HARD)
    name = lambda task, **kw: (
        data.task_data_config(task, **{"num_train": 10, "num_test": 5, "seed": 0, **kw}).name
    )
    names = {
        name(easy),
        name(easy, num_train=11),
        name(easy, num_test=6),
        name(easy, seed=1),
        name(hard),
        name(arith.ArithTask(arith.EASY, test_fraction=0.2)),
        name(arith.ArithTask(arith.ArithDifficulty(max_digits=4))),
    }
    assert len(names) == 7
    with pytest.raises(ValueError, match="num_train"):
        data.task_data_config(easy, num_train=-1, num_test=5, seed=0)


def test_builder_writes_a_user_task(tmp_path):
    from user_task import ReverseTask  # tests/user_task.py: a task defined outside replax

    task = ReverseTask(4)
    builder = data.prepare_task_data(tmp_path, task, num_train=20, num_test=6, seed=2)
    expected = task.examples("test", 6, seed=2)
    assert data.eval_examples(builder.as_data_source("test"), 6) == [
        (e.prompt, e.answer) for e in expected
    ]
    assert len(builder.as_data_source("train")) == 20


def test_eval_examples(arith_builder):
    test = arith_builder.as_data_source("test")
    assert data.eval_examples(test, 3) == data.eval_examples(test, 5)[:3]
    assert all(isinstance(p, str) and p.endswith("=") for p, _ in data.eval_examples(test, 5))
    with pytest.raises(ValueError, match="51"):
        data.eval_examples(test, NUM_TEST + 1)


def test_prompt_dataset_batches(arith_builder):
    source = arith_builder.as_data_source("train")
    tok = ByteTokenizer()
    dataset = data.prompt_dataset(source, tok, max_prompt_len=8, batch_size=4, seed=0)
    batch = _batches(dataset, 1)[0]
    assert batch["prompt_ids"].dtype == np.int32 and batch["prompt_ids"].shape == (4, 8)
    assert batch["prompt_mask"].dtype == bool and batch["prompt_mask"].shape == (4, 8)
    assert batch["index"].dtype == np.int64 and batch["index"].shape == (4,)
    assert batch["answer"].shape == (4,)
    for row in range(4):
        record = source[int(batch["index"][row])]
        ids, mask = encode_prompts(tok, [record["prompt"].decode()], 8)
        np.testing.assert_array_equal(batch["prompt_ids"][row], ids[0])
        np.testing.assert_array_equal(batch["prompt_mask"][row], mask[0])
        assert str(batch["answer"][row]) == record["answer"].decode()


def test_prompt_dataset_deterministic_by_seed_and_epochs_reshuffle():
    # Any sequence of dicts is a source. (Grain's index shuffle is slow on tiny ranges.)
    source = [{"prompt": f"{i}+0=", "answer": str(i)} for i in range(100)]
    make = lambda seed: data.prompt_dataset(
        source, ByteTokenizer(), max_prompt_len=6, batch_size=25, seed=seed
    )
    first = np.concatenate([b["index"] for b in _batches(make(0), 8)])  # two epochs
    again = np.concatenate([b["index"] for b in _batches(make(0), 8)])
    other = np.concatenate([b["index"] for b in _batches(make(1), 8)])
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)
    epochs = first.reshape(2, 100)
    assert all(sorted(epoch) == list(range(100)) for epoch in epochs)  # each epoch: all once
    assert not np.array_equal(epochs[0], epochs[1])


def test_prompt_dataset_without_shuffle_or_repeat():
    source = [{"prompt": f"{i}=", "answer": str(i)} for i in range(7)]
    dataset = data.prompt_dataset(
        source,
        ByteTokenizer(),
        max_prompt_len=4,
        batch_size=3,
        seed=0,
        shuffle=False,
        repeat=False,
    )
    assert [b["index"].tolist() for b in dataset] == [[0, 1, 2], [3, 4, 5]]  # remainder dropped


def test_prompt_dataset_too_long_prompt_raises():
    source = [{"prompt": "123456789+1=", "answer": "123456790"}]
    dataset = data.prompt_dataset(source, ByteTokenizer(), max_prompt_len=8, batch_size=1, seed=0)
    with pytest.raises(ValueError, match=r"123456789\+1=.*max_len=8"):
        next(iter(dataset))


def test_iterator_resumes_from_state(arith_builder):
    dataset = data.prompt_dataset(
        arith_builder.as_data_source("train"),
        ByteTokenizer(),
        max_prompt_len=8,
        batch_size=16,
        seed=3,
    )
    iterator = iter(dataset)
    for _ in range(3):
        next(iterator)
    state = json.loads(json.dumps(iterator.get_state()))  # JSON-able, as orbax stores it
    expected = [next(iterator) for _ in range(2)]
    restored = iter(dataset)
    restored.set_state(state)
    for want, got in zip(expected, [next(restored) for _ in range(2)]):
        for key in want:
            np.testing.assert_array_equal(want[key], got[key])


def test_iterator_checkpoints_with_orbax(tmp_path):
    ocp = pytest.importorskip("orbax.checkpoint")
    import grain

    source = [{"prompt": f"{i}=", "answer": str(i)} for i in range(200)]
    dataset = data.prompt_dataset(source, ByteTokenizer(), max_prompt_len=5, batch_size=4, seed=0)
    iterator = iter(dataset)
    next(iterator)
    with ocp.CheckpointManager(tmp_path / "ckpt") as manager:
        manager.save(
            1, args=ocp.args.Composite(data_iter=grain.checkpoint.CheckpointSave(iterator))
        )
        manager.wait_until_finished()
        expected = next(iterator)["index"]
        restored = iter(dataset)
        manager.restore(
            1, args=ocp.args.Composite(data_iter=grain.checkpoint.CheckpointRestore(restored))
        )
    np.testing.assert_array_equal(next(restored)["index"], expected)


def test_a_data_build_prints_nothing_of_tfds(tmp_path, capfd, caplog):
    """The data is generated locally: tfds's "Downloading and preparing dataset Unknown
    size..." and "... downloaded and prepared" lines (and its progress bars) say nothing
    true about it, on a machine without network least of all."""
    task = arith.ArithTask(arith.EASY)
    data.prepare_task_data(tmp_path, task, num_train=20, num_test=6, seed=3)
    data.prepare_task_data(tmp_path, task, num_train=20, num_test=6, seed=3)  # reused
    out, err = capfd.readouterr()
    assert "Downloading and preparing" not in out + err
    assert "downloaded and prepared" not in out + err
    assert "Generating splits" not in out + err and "Shuffling" not in out + err
    assert out + err == "", out + err
    # Nor its warnings ("Using custom data configuration ..."), which absl writes to stderr.
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_data_build_still_raises_its_errors(tmp_path):
    from user_task import ReverseTask

    class Broken(ReverseTask):
        def examples(self, split, num, seed):
            raise RuntimeError("the task's own error")

    with pytest.raises(RuntimeError, match="the task's own error"):
        data.prepare_task_data(tmp_path, Broken(4), num_train=4, num_test=2, seed=0)
