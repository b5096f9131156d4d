"""Tests for replax/run/checkpoint.py: a save / restore round trip of everything a run carries
(train state, replay store, loop state, grain data iterator), the train state alone,
latest_step and max_to_keep. Restores go into peers whose every value is off by one, so
equal values can only come from the checkpoint."""

import json
import os
import signal
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorstore as ts
from orbax.checkpoint.path import atomicity

from replax.core import sharding
from replax.core.config_utils import ConfigError
from replax.model import transformer as model_lib
from replax.replay.store import ReplayConfig, make_replay_buffer
from replax.rl import train_step as train_step_lib
from replax.run import checkpoint
from replax.run.metrics import ComputeAccount
from replax.tasks import pipeline as data
from replax.text.tokenizer import ByteTokenizer

CONFIG = model_lib.ModelConfig(
    vocab_size=32,
    num_layers=1,
    d_model=16,
    num_heads=2,
    num_kv_heads=2,
    head_dim=8,
    mlp_dim=32,
    max_len=8,
)
MODEL = model_lib.Transformer(CONFIG)
RULES = sharding.validate_rules(sharding.DEFAULT_RULES)
OPTIMIZER = train_step_lib.make_optimizer(train_step_lib.OptimizerConfig(learning_rate=1e-2))
BUFFER = make_replay_buffer(ReplayConfig(capacity=8), 4)
# Ten prompts "0+0=" ... "9+9=", batched two at a time, shuffled.
SOURCE = [{"prompt": f"{i}+{i}=", "answer": str(2 * i)} for i in range(10)]


@pytest.fixture(scope="module")
def mesh():
    return sharding.make_mesh((2, 2, 2))


def make_replay_state(mesh, first_id):
    """A buffer of 8 slots (4 shards of 2) holding items first_id, ..., first_id + 3, one
    per shard (tokens [id, -id])."""
    example = {"tokens": jnp.zeros((2,), jnp.int32), "reward": jnp.zeros((), jnp.float32)}
    state = BUFFER.init(example)
    ids = jnp.arange(first_id, first_id + 4, dtype=jnp.int32)
    items = {"tokens": jnp.stack([ids, -ids], axis=1), "reward": ids.astype(jnp.float32) / 10}
    state = BUFFER.add(state, items, step=3)
    return jax.device_put(state, BUFFER.state_sharding(state, mesh, ("data", "fsdp")))


def make_iterator():
    dataset = data.prompt_dataset(SOURCE, ByteTokenizer(), max_prompt_len=6, batch_size=2, seed=0)
    return iter(dataset)


def assert_trees_equal(actual, expected):
    assert jax.tree.structure(actual) == jax.tree.structure(expected)
    for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected)):
        if jnp.issubdtype(e.dtype, jax.dtypes.prng_key):
            a, e = jax.random.key_data(a), jax.random.key_data(e)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(e))


def assert_same_layout(actual, expected):
    for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected)):
        assert a.sharding.is_equivalent_to(e.sharding, a.ndim), (a.sharding, e.sharding)


def off_by_one(tree):
    """A peer of `tree`: same structure and layout, every value plus one."""
    return jax.tree.map(lambda x: x + 1, tree)


@pytest.fixture(scope="module")
def saved(mesh, tmp_path_factory):
    """A checkpoint at step 3 of a run, what it held, and the next two data batches."""
    directory = str(tmp_path_factory.mktemp("checkpoints"))
    train_state, _ = train_step_lib.init_train_state(
        MODEL, OPTIMIZER, jax.random.key(0), mesh, RULES
    )
    replay_state = make_replay_state(mesh, first_id=1)
    account = ComputeAccount(gen_tokens=120, gen_s=1.5, train_s=0.5, gen_rollouts=8, steps=3)
    loop_state = {"step": 3, "account": account.as_dict(), "rng_key": [0, 42]}
    iterator = make_iterator()
    for _ in range(3):
        next(iterator)
    writer = checkpoint.Checkpointer(directory)
    writer.save(
        3,
        train_state=train_state,
        replay_state=replay_state,
        loop_state=loop_state,
        data_iterator=iterator,
    )
    writer.close()
    return {
        "directory": directory,
        "train_state": train_state,
        "replay_state": replay_state,
        "loop_state": loop_state,
        # What the saved run would have read next.
        "following": [next(iterator) for _ in range(2)],
    }


def test_round_trip_restores_every_part_and_the_data_position(saved):
    # A resumed run: fresh peers and an iterator at the start of the data.
    peer_train = off_by_one(saved["train_state"])
    peer_replay = off_by_one(saved["replay_state"])
    peer_iterator = make_iterator()
    reader = checkpoint.Checkpointer(saved["directory"])
    assert reader.latest_step() == 3
    train_out, replay_out, loop_out = reader.restore(
        3, train_state=peer_train, replay_state=peer_replay, data_iterator=peer_iterator
    )
    reader.close()

    assert_trees_equal(train_out, saved["train_state"])
    assert_trees_equal(replay_out, saved["replay_state"])
    valid = np.asarray(replay_out.valid, bool)
    np.testing.assert_array_equal(np.asarray(replay_out.items["tokens"])[valid, 0], [1, 2, 3, 4])
    assert_same_layout(train_out, saved["train_state"])
    assert_same_layout(replay_out, saved["replay_state"])
    assert loop_out == saved["loop_state"]
    assert ComputeAccount(**loop_out["account"]).gen_tokens == 120
    for expected in saved["following"]:
        got = next(peer_iterator)
        np.testing.assert_array_equal(got["index"], expected["index"])
        np.testing.assert_array_equal(got["prompt_ids"], expected["prompt_ids"])


def test_each_array_tree_is_one_commit(saved):
    """Each OCDBT commit rewrites the tree's root node with every small value inlined: a
    tree committed array by array kept a dead copy per commit, as many as thread timing
    made. One commit a tree leaves one version and the same bytes every run."""
    for item in ("train_state", "replay_state"):
        path = os.path.join(saved["directory"], "3", item, "ocdbt.process_0", "")
        base = ts.KvStore.open({"driver": "file", "path": path}).result()
        versions = ts.ocdbt.dump(base).result()["versions"]
        assert len(versions) == 1, (item, [v["root"]["statistics"] for v in versions])


def test_restore_train_state_alone(saved):
    peer = off_by_one(saved["train_state"])
    reader = checkpoint.Checkpointer(saved["directory"])
    restored = reader.restore_train_state(3, train_state=peer)
    reader.close()
    assert_trees_equal(restored, saved["train_state"])
    assert_same_layout(restored, peer)


def test_latest_step_and_max_to_keep(tmp_path):
    """Plain pytrees are enough for the bookkeeping: step k stores the value k."""
    ckpt = checkpoint.Checkpointer(str(tmp_path), max_to_keep=2, asynchronous=False)
    assert ckpt.latest_step() is None
    for step in (1, 2, 3):
        ckpt.save(
            step,
            train_state={"w": jnp.full((2,), float(step))},
            replay_state={"n": jnp.int32(step)},
            loop_state={"step": step},
        )
    assert ckpt.latest_step() == 3
    ckpt.close()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.isdigit()) == ["2", "3"]

    reader = checkpoint.Checkpointer(str(tmp_path))
    train, replay, loop = reader.restore(
        2, train_state={"w": jnp.zeros((2,))}, replay_state={"n": jnp.int32(0)}
    )
    reader.close()
    np.testing.assert_array_equal(train["w"], [2.0, 2.0])
    assert int(replay["n"]) == 2 and loop == {"step": 2}


def _three_steps(directory):
    """Steps 1, 2, 3 of plain pytrees (step k stores k), all sealed with checksums."""
    ckpt = checkpoint.Checkpointer(directory, max_to_keep=3)
    for step in (1, 2, 3):
        ckpt.save(
            step,
            train_state={"w": jnp.full((64,), float(step))},
            replay_state={"n": jnp.int32(step)},
            loop_state={"step": step},
        )
    ckpt.close()


def _restore_latest(directory, temporary_path_class=None):
    lines = []
    reader = checkpoint.Checkpointer(
        directory, max_to_keep=3, temporary_path_class=temporary_path_class
    )
    restored = reader.restore_latest(
        train_state={"w": jnp.zeros((64,))},
        replay_state={"n": jnp.int32(0)},
        log=lines.append,
    )
    reader.close()
    return restored, lines


def _data_files(step_dir):
    """The files of a checkpoint's arrays, loop state and data iterator: those its seal
    lists (orbax's commit bookkeeping is not among them)."""
    return [step_dir / name for name in json.loads((step_dir / checkpoint.CHECKSUMS).read_text())]


@pytest.mark.parametrize(
    "damage", ["flip_bytes", "delete", "truncate", "garbage_loop_state", "garbage_unsealed"]
)
def test_a_damaged_latest_checkpoint_is_reported_and_the_previous_one_used(tmp_path, damage):
    _three_steps(str(tmp_path))
    latest = tmp_path / "3"
    assert (latest / checkpoint.CHECKSUMS).exists()
    if damage.startswith("garbage"):
        (latest / "loop_state" / "metadata").write_text("{not json")
        if damage == "garbage_unsealed":  # no checksums: orbax's own read must fail
            (latest / checkpoint.CHECKSUMS).unlink()
    else:
        target = max(_data_files(latest), key=lambda p: p.stat().st_size)
        if damage == "flip_bytes":
            raw = bytearray(target.read_bytes())
            raw[len(raw) // 2 : len(raw) // 2 + 16] = bytes(16)
            target.write_bytes(bytes(raw))
        elif damage == "delete":
            target.unlink()
        else:
            target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])
    (train, replay, loop), lines = _restore_latest(str(tmp_path))
    assert loop == {"step": 2} and int(replay["n"]) == 2
    np.testing.assert_array_equal(train["w"], np.full(64, 2.0))
    assert len(lines) == 1 and lines[0].startswith("checkpoint 3 ")
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.isdigit()) == ["1", "2"]
    assert (tmp_path.parent / (tmp_path.name + "_corrupt") / "3").is_dir()


@pytest.mark.parametrize("protocol", ["rename", "commit_file"])
def test_a_save_is_sealed_when_it_commits(tmp_path, protocol):
    """The newest checkpoint carries its checksums as soon as it exists: no later save or
    close is needed (an asynchronous save seals itself before orbax commits it). The
    commit-file protocol is orbax's for object stores such as gs://, run on a local disk."""
    path_class = atomicity.CommitFileTemporaryPath if protocol == "commit_file" else None
    ckpt = checkpoint.Checkpointer(str(tmp_path), max_to_keep=3, temporary_path_class=path_class)
    ckpt.save(
        1, train_state={"w": jnp.ones((64,))}, replay_state={"n": jnp.int32(1)}, loop_state={}
    )
    ckpt.manager.wait_until_finished()  # the save's own end, not the next save or close
    assert (tmp_path / "1" / checkpoint.CHECKSUMS).exists()
    assert checkpoint.verify_checksums(tmp_path / "1") is None
    assert 0 < ckpt.unsealed_s[1] < 60
    ckpt.close()
    sealed = json.loads((tmp_path / "1" / checkpoint.CHECKSUMS).read_text())
    # Every file of the arrays is in the seal.
    assert any(name.startswith("train_state/") and "/d/" in name for name in sealed)


@pytest.mark.parametrize("damage", ["no_checksums", "checksums_cut_short"])
def test_an_unsealed_checkpoint_is_never_restored(tmp_path, damage):
    """A step without a complete seal (a save the process did not live to seal, or a seal
    cut short on a store without atomic writes) is not committed: reported in one line
    naming the step used instead, set aside, and the newest sealed one restored."""
    _three_steps(str(tmp_path))
    seal = tmp_path / "3" / checkpoint.CHECKSUMS
    if damage == "no_checksums":
        seal.unlink()
    else:
        seal.write_text(seal.read_text()[: seal.stat().st_size // 2])
    (_, _, loop), lines = _restore_latest(str(tmp_path))
    assert loop == {"step": 2}
    assert len(lines) == 1
    assert lines[0].startswith("checkpoint 3 was never sealed (the process stopped while saving")
    assert lines[0].endswith("; resuming from step 2")
    assert (tmp_path.parent / (tmp_path.name + "_corrupt") / "3").is_dir()


def test_with_no_sealed_checkpoint_the_run_starts_again_and_says_so(tmp_path):
    _three_steps(str(tmp_path))
    for step in ("1", "2", "3"):
        (tmp_path / step / checkpoint.CHECKSUMS).unlink()
    restored, lines = _restore_latest(str(tmp_path))
    assert restored is None and len(lines) == 3
    assert all(line.endswith("the run starts again from step 0") for line in lines)


@pytest.mark.parametrize("protocol", ["rename", "commit_file"])
@pytest.mark.parametrize("point", ["write", "seal"])
def test_a_kill_inside_the_save_or_the_seal_leaves_no_committed_unsealed_step(
    tmp_path, protocol, point
):
    """SIGKILL while step 2's arrays are being written, or half-way through writing its
    seal: step 1 is what a restart restores, with at most one line about step 2."""
    script = f"""
import jax.numpy as jnp
from orbax.checkpoint.path import atomicity
from replax.run import checkpoint
path_class = atomicity.CommitFileTemporaryPath if {protocol == "commit_file"} else None
ckpt = checkpoint.Checkpointer({str(tmp_path)!r}, max_to_keep=3, temporary_path_class=path_class)
for step in (1, 2):
    ckpt.save(step, train_state={{"w": jnp.full((64,), float(step))}},
              replay_state={{"n": jnp.int32(step)}}, loop_state={{"step": step}})
ckpt.close()
"""
    env = {**os.environ, "REPLAX_CRASH_AT": f"{point}:2"}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    path_class = atomicity.CommitFileTemporaryPath if protocol == "commit_file" else None
    (train, _, loop), lines = _restore_latest(str(tmp_path), path_class)
    assert loop == {"step": 1}
    np.testing.assert_array_equal(train["w"], np.full(64, 1.0))
    assert len(lines) <= 1 and all(
        line.startswith("checkpoint 2 was never sealed") for line in lines
    )


def test_no_readable_checkpoint_gives_none(tmp_path):
    _three_steps(str(tmp_path))
    for step in ("1", "2", "3"):
        (tmp_path / step / checkpoint.CHECKSUMS).write_text("{}garbage")
    restored, lines = _restore_latest(str(tmp_path))
    assert restored is None and len(lines) == 3


def test_pick_sealed_reads_only_sealed_intact_steps_and_moves_nothing(tmp_path):
    """What evaluation and export read: the newest step whose files match its seal (the
    ones passed over reported), or a named step only when it is one."""
    _three_steps(str(tmp_path))
    (tmp_path / "3" / checkpoint.CHECKSUMS).unlink()  # a save cut short before its seal
    target = max(_data_files(tmp_path / "2"), key=lambda p: p.stat().st_size)
    target.write_bytes(target.read_bytes()[:-8])  # step 2's sealed files, changed
    reader = checkpoint.Checkpointer(str(tmp_path), max_to_keep=3)
    lines = []
    assert reader.pick_sealed(log=lines.append) == 1
    assert [line.split(" ", 2)[1] for line in lines] == ["3", "2"]
    assert lines[0].startswith("checkpoint 3 was never sealed")
    assert reader.sealed_steps() == [1, 2]  # readable seals; step 2's files fail them
    assert reader.pick_sealed(1) == 1
    with pytest.raises(ConfigError, match=r"^--step=7 is not a checkpoint of .*: the sealed "):
        reader.pick_sealed(7)
    with pytest.raises(
        ConfigError, match=r"^--step=3: checkpoint 3 was never sealed .*are \[1, 2\]$"
    ):
        reader.pick_sealed(3)
    with pytest.raises(
        ConfigError, match=r"^--step=2: checkpoint 2 .* does not match its checksum"
    ):
        reader.pick_sealed(2)
    reader.close()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.isdigit()) == ["1", "2", "3"]
    assert not (tmp_path.parent / (tmp_path.name + "_corrupt")).exists()


def test_last_sealed_step_is_the_newest_committed_step_with_a_readable_seal(tmp_path):
    """What a stopped run of several processes names as the step to resume from: the
    newest numbered step whose checksums.json reads, temporary and unsealed ones aside."""
    assert checkpoint.last_sealed_step(tmp_path / "none") is None
    for name, seal in [("2", {"a": "x"}), ("4", None), ("6.orbax-checkpoint-tmp", {"a": "x"})]:
        (tmp_path / name).mkdir()
        if seal is not None:
            (tmp_path / name / checkpoint.CHECKSUMS).write_text(json.dumps(seal))
    (tmp_path / "3").mkdir()
    (tmp_path / "3" / checkpoint.CHECKSUMS).write_text('{"a": ')  # cut short
    assert checkpoint.last_sealed_step(tmp_path) == 2
