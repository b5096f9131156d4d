"""Tests for replax/data.py: TFDS builders (ArrayRecord) and grain prompt pipelines."""

import json

import numpy as np
import pytest

from replax import data
from replax.tasks import arith
from replax.tokenizer import ByteTokenizer, encode_prompts

NUM_TRAIN, NUM_TEST = 200, 50


@pytest.fixture(scope="module")
def arith_builder(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("data")
    return data.prepare_arith(data_dir, "easy", num_train=NUM_TRAIN, num_test=NUM_TEST, seed=0)


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


def test_arith_builder_reuses_prepared_data_and_names_configs_by_params(arith_builder):
    again = data.prepare_arith(
        arith_builder.data_dir.split("/replax_arith")[0],
        "easy",
        num_train=NUM_TRAIN,
        num_test=NUM_TEST,
        seed=0,
    )
    assert again.data_path == arith_builder.data_path
    names = {
        data.arith_config("easy", num_train=10).name,
        data.arith_config("easy", num_train=11).name,
        data.arith_config("easy", num_train=10, seed=1).name,
        data.arith_config("hard", num_train=10).name,
        data.arith_config(arith.ArithDifficulty(max_digits=4), num_train=10).name,
    }
    assert len(names) == 5
    with pytest.raises(ValueError, match="difficulty"):
        data.arith_config("medium")


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


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_gsm8k_builder(tmp_path):
    manual_dir = tmp_path / "manual"
    manual_dir.mkdir()
    train = [
        {"question": "Ann has 3 pens and buys 4. How many?", "answer": "3+4=7\n#### 7"},
        {"question": "What is 10 times 100?", "answer": "10*100=1000\n#### 1,000"},
    ]
    _write_jsonl(manual_dir / "train.jsonl", train)
    _write_jsonl(manual_dir / "test.jsonl", train[:1])
    builder = data.prepare_gsm8k(tmp_path / "data", manual_dir)
    assert data.eval_examples(builder.as_data_source("train"), 2) == [
        ("Ann has 3 pens and buys 4. How many?", "7"),
        ("What is 10 times 100?", "1,000"),
    ]
    assert len(builder.as_data_source("test")) == 1
    # Prepared data is reused; the manual dir is not needed again.
    again = data.prepare_gsm8k(tmp_path / "data", tmp_path / "gone")
    assert len(again.as_data_source("train")) == 2


def test_gsm8k_builder_malformed_line_names_file_and_line(tmp_path):
    manual_dir = tmp_path / "manual"
    manual_dir.mkdir()
    (manual_dir / "train.jsonl").write_text(
        json.dumps({"question": "q", "answer": "#### 1"}) + "\n{not json\n"
    )
    _write_jsonl(manual_dir / "test.jsonl", [{"question": "q", "answer": "#### 1"}])
    with pytest.raises(ValueError, match=r"train\.jsonl:2"):
        data.prepare_gsm8k(tmp_path / "data", manual_dir)


def test_gsm8k_builder_missing_manual_dir(tmp_path):
    missing = tmp_path / "no_such_dir"
    with pytest.raises(FileNotFoundError, match="no_such_dir"):
        data.prepare_gsm8k(tmp_path / "data", missing)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="empty"):
        data.prepare_gsm8k(tmp_path / "data", empty)
    (empty / "train.jsonl").write_text("")
    with pytest.raises(FileNotFoundError, match="test.jsonl"):
        data.prepare_gsm8k(tmp_path / "data", empty)
