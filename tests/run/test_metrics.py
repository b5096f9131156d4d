"""Tests for replax/run/metrics.py: metrics.jsonl and samples.jsonl (one line per record,
truncated on resume), the TensorBoard mirror and the compute account."""

import importlib.util
import json
import os
import struct
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest
from tensorboardX.proto import event_pb2

from replax.run import metrics


def lines(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return f.read().splitlines()


def write_steps(workdir, steps, resume_step=-1):
    writer = metrics.MetricsWriter(str(workdir), resume_step=resume_step)
    for step in steps:
        writer.write(step, {"reward_mean": step / 10})
    writer.close()


def read_events(workdir):
    """Every Event proto in the TensorBoard event files, in order: TFRecord framing
    (uint64 length, uint32 crc, payload, uint32 crc) around each."""
    tb_dir = os.path.join(workdir, "tensorboard")
    for name in sorted(os.listdir(tb_dir)):
        with open(os.path.join(tb_dir, name), "rb") as f:
            blob = f.read()
        pos = 0
        while pos < len(blob):
            (length,) = struct.unpack("<Q", blob[pos : pos + 8])
            yield event_pb2.Event.FromString(blob[pos + 12 : pos + 12 + length])
            pos += 12 + length + 4


def read_scalars(workdir):
    """(tag, step, value) of every scalar in the TensorBoard event files."""
    return [
        (value.tag, event.step, value.simple_value)
        for event in read_events(workdir)
        for value in event.summary.value
    ]


def test_write_appends_one_json_line_per_call_with_plain_values(tmp_path):
    writer = metrics.MetricsWriter(str(tmp_path))
    writer.write(1, {"reward_mean": np.float32(0.5), "gen_tokens": np.int64(12)})
    writer.write(
        2,
        {
            "loss": jnp.float32(0.25),
            "lengths": np.array([3, 4]),
            "is_ess": float("nan"),
            "mu_measured": None,
        },
    )
    writer.close()
    assert lines(tmp_path) == [
        '{"step": 1, "reward_mean": 0.5, "gen_tokens": 12}',
        '{"step": 2, "loss": 0.25, "lengths": [3, 4], "is_ess": null, "mu_measured": null}',
    ]
    assert metrics.read_metrics(str(tmp_path)) == [
        {"step": 1, "reward_mean": 0.5, "gen_tokens": 12},
        {"step": 2, "loss": 0.25, "lengths": [3, 4], "is_ess": None, "mu_measured": None},
    ]


def test_resume_keeps_records_up_to_the_checkpoint_and_drops_the_rest(tmp_path):
    write_steps(tmp_path, [1, 2, 3, 4, 5])
    # Resumed from the checkpoint of step 3: steps 4 and 5 are written again.
    write_steps(tmp_path, [4, 5, 6], resume_step=3)
    records = metrics.read_metrics(str(tmp_path))
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert [r["reward_mean"] for r in records] == [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]


def test_a_fresh_run_in_an_old_workdir_starts_an_empty_file(tmp_path):
    write_steps(tmp_path, [1, 2, 3])
    write_steps(tmp_path, [1])  # resume_step=-1: no checkpoint to resume from
    assert [r["step"] for r in metrics.read_metrics(str(tmp_path))] == [1]


def test_tensorboard_mirrors_the_numeric_values(tmp_path):
    writer = metrics.MetricsWriter(str(tmp_path))
    writer.write(1, {"reward_mean": 0.5, "gen_tokens": 12, "mu_measured": None, "name": "a"})
    writer.write(2, {"reward_mean": 0.75})
    writer.close()
    scalars = read_scalars(str(tmp_path))
    assert sorted(scalars) == [
        ("train/gen_tokens", 1, 12.0),
        ("train/reward_mean", 1, 0.5),
        ("train/reward_mean", 2, 0.75),
    ]


def test_tensorboard_groups_its_tags_and_metrics_jsonl_keeps_its_keys(tmp_path):
    record = {
        "reward_mean": 0.5,
        "learning_rate": 1e-4,
        "eval_accuracy": 0.25,
        "eval_pass_at_k": 0.5,
        "entropy": 0.3,
        "replay_age_mean": 3.0,
        "is_ess": 0.9,
        "clip_frac": 0.1,
        "policy_lag_mean": 1.0,
        "sampler_busy_frac": 0.7,
        "replay_ratio_realised": 4.0,
    }
    writer = metrics.MetricsWriter(str(tmp_path))
    writer.write(5, record)
    writer.write_samples(5, SAMPLES)
    writer.close()
    texts = read_texts(tmp_path)
    scalars = {tag for tag, _, _ in read_scalars(str(tmp_path))} - {t for t, _, _ in texts}
    assert scalars == {
        "train/reward_mean",
        "train/learning_rate",
        "eval/eval_accuracy",
        "eval/eval_pass_at_k",
        "eval/entropy",
        "replay/replay_age_mean",
        "replay/is_ess",
        "replay/clip_frac",
        "placement/policy_lag_mean",
        "placement/sampler_busy_frac",
        "placement/replay_ratio_realised",
    }
    ((tag, _, _),) = texts
    assert tag.startswith("eval/samples")
    (line,) = metrics.read_metrics(str(tmp_path))
    assert line == {"step": 5, **record}  # metrics.jsonl's keys as they were


def test_mu_measured_is_generation_over_training_seconds_per_rollout():
    # Generation: 6 s for 3 rollouts = 2 s each; training: 2 s for 4 rollouts = 0.5 s each.
    account = metrics.ComputeAccount(gen_s=6.0, gen_rollouts=3, train_s=2.0, train_rollouts=4)
    assert account.mu_measured() == pytest.approx(4.0)
    account.gen_s += 6.0
    account.gen_rollouts += 1  # 12 s / 4 = 3 s each
    assert account.mu_measured() == pytest.approx(6.0)


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"gen_s": 1.0, "gen_rollouts": 2, "train_s": 0.0, "train_rollouts": 2},
        {"gen_s": 1.0, "gen_rollouts": 0, "train_s": 1.0, "train_rollouts": 2},
        {"gen_s": 1.0, "gen_rollouts": 2, "train_s": 1.0, "train_rollouts": 0},
    ],
)
def test_mu_measured_is_none_before_both_phases_ran(fields):
    assert metrics.ComputeAccount(**fields).mu_measured() is None


def test_account_round_trips_through_json():
    account = metrics.ComputeAccount(
        gen_tokens=100, gen_flops=2e9, train_flops=6e9, gen_s=1.5, train_s=0.5, steps=3, updates=2
    )
    restored = metrics.ComputeAccount.from_dict(json.loads(json.dumps(account.as_dict())), 32)
    assert restored == account


def test_an_account_saved_before_train_cost_resumes_it_from_the_rollouts():
    saved = {"train_rollouts": 96, "train_flops": 6e9, "steps": 3}  # no train_cost key
    restored = metrics.ComputeAccount.from_dict(saved, 32)
    assert restored.train_cost == 96.0
    # Nor its updates: each then took train.batch_size rollouts.
    assert restored.updates == 3


def test_records_from_before_train_cost_get_it_from_their_config():
    """Such a run's step with a covariance option in microbatches ran a forward more (4/3
    a plain step), with a KL reference as well another (5/3); neither, or the option in one
    pass, none (1). Records that have train_cost keep it."""
    from replax.rl import objectives

    assert metrics.COVARIANCE_OPTIONS == objectives.COVARIANCE_OPTIONS
    klcov = {"loss": {"kl_cov_frac": 0.002, "kl_coef": 0.0}, "train": {"num_microbatches": 4}}
    both = {"loss": {"cov_cut_frac": 0.2, "kl_coef": 0.1}, "train": {"num_microbatches": 2}}
    one_pass = {"loss": {"kl_cov_frac": 0.002}, "train": {"num_microbatches": 1}}
    assert metrics.legacy_step_cost(klcov) == pytest.approx(4 / 3)
    assert metrics.legacy_step_cost(both) == pytest.approx(5 / 3)
    assert metrics.legacy_step_cost(one_pass) == metrics.legacy_step_cost(None) == 1.0
    records = [{"step": s, "train_rollouts": 8 * s} for s in (1, 2, 3)]
    filled = metrics.backfill_train_cost(records, klcov)
    assert [r["train_cost"] for r in filled] == pytest.approx([32 / 3, 64 / 3, 32])
    assert metrics.backfill_train_cost(filled, both) == filled  # kept: left alone


def test_a_last_line_cut_short_by_a_kill_is_dropped(tmp_path):
    write_steps(tmp_path, [1, 2])
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "loss": 0.')  # killed mid-write
    assert [r["step"] for r in metrics.read_metrics(str(tmp_path))] == [1, 2]
    write_steps(tmp_path, [3], resume_step=2)
    assert [r["step"] for r in metrics.read_metrics(str(tmp_path))] == [1, 2, 3]


def test_a_broken_line_inside_the_file_is_an_error_naming_it(tmp_path):
    write_steps(tmp_path, [1])
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write("garbage\n" + json.dumps({"step": 2}) + "\n")
    with pytest.raises(ValueError, match=r"metrics\.jsonl:2"):
        metrics.read_metrics(str(tmp_path))


SAMPLES = [
    {"index": 0, "prompt": "1+1=", "completion": "2", "reward": 1.0, "answer": "2"},
    {"index": 1, "prompt": "2|3=", "completion": "6\n", "reward": 0.0, "answer": "5"},
]


def read_samples(workdir):
    with open(os.path.join(workdir, "samples.jsonl")) as f:
        return [json.loads(line) for line in f]


def read_texts(workdir):
    """(tag, step, text) of every text summary in the TensorBoard event files."""
    return [
        (value.tag, event.step, value.tensor.string_val[0].decode())
        for event in read_events(workdir)
        for value in event.summary.value
        if value.tensor.string_val
    ]


def test_samples_go_to_samples_jsonl_with_their_step_and_to_tensorboard_as_text(tmp_path):
    writer = metrics.MetricsWriter(str(tmp_path))
    writer.write_samples(3, SAMPLES)
    writer.write_samples(4, [])  # an evaluation without samples writes nothing
    writer.close()
    assert read_samples(tmp_path) == [{"step": 3, **s} for s in SAMPLES]
    ((tag, step, text),) = read_texts(tmp_path)
    assert tag.startswith("eval/samples") and step == 3
    lines = text.splitlines()
    assert lines[0] == "index | prompt | completion | reward | answer"
    # A | in a prompt is escaped and a newline kept inside its table cell.
    assert lines[3] == "1 | 2\\|3= | 6<br> | 0.0 | 5"


def test_a_resumed_run_drops_the_samples_past_its_checkpoint(tmp_path):
    writer = metrics.MetricsWriter(str(tmp_path))
    for step in (2, 4, 6):
        writer.write_samples(step, SAMPLES[:1])
    writer.close()
    writer = metrics.MetricsWriter(str(tmp_path), resume_step=4)
    writer.write_samples(6, SAMPLES[1:])
    writer.close()
    got = [(r["step"], r["index"]) for r in read_samples(tmp_path)]
    assert got == [(2, 0), (4, 0), (6, 1)]


def test_a_writer_on_another_process_writes_no_samples(tmp_path):
    writer = metrics.MetricsWriter(str(tmp_path), enabled=False)
    writer.write_samples(1, SAMPLES)
    writer.close()
    assert not (tmp_path / "samples.jsonl").exists()


class FakeWandb:
    """Stands in for the wandb package: records init's arguments and logged scalars."""

    def __init__(self):
        self.inits, self.logged, self.finished = [], [], 0

    def init(self, **kwargs):
        self.inits.append(kwargs)
        return self

    def log(self, scalars, step):
        self.logged.append((step, scalars))

    def finish(self):
        self.finished += 1


def test_wandb_mirrors_the_scalars_under_the_grouped_tags(tmp_path, monkeypatch):
    import sys

    fake = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    (tmp_path / "run").mkdir()
    writer = metrics.MetricsWriter(str(tmp_path / "run"), wandb_mode="offline", config={"seed": 3})
    writer.write(1, {"reward_mean": 0.5, "eval_accuracy": 0.25, "replay_age_mean": 2.0})
    writer.close()
    ((init,),) = [fake.inits]
    assert (init["mode"], init["id"], init["config"]) == ("offline", "run", {"seed": 3})
    assert init["dir"] == str(tmp_path / "run")
    assert fake.logged == [
        (1, {"train/reward_mean": 0.5, "eval/eval_accuracy": 0.25, "replay/replay_age_mean": 2.0})
    ]
    assert fake.finished == 1
    # metrics.jsonl keeps its own keys.
    assert metrics.read_metrics(str(tmp_path / "run"))[0]["reward_mean"] == 0.5


def test_log_wandb_without_the_package_is_a_one_line_config_error(monkeypatch):
    import importlib.util

    from replax.config import sections
    from replax.core.config_utils import ConfigError

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a)
    )
    with pytest.raises(ConfigError, match=r"log.wandb=True needs the wandb package: pip install"):
        sections.LogSection(print_every_s=0.0, wandb=True)
    with pytest.raises(ConfigError, match="log.wandb_mode"):
        sections.LogSection(print_every_s=0.0, wandb_mode="cloud")


def test_the_tensorboard_writer_does_not_import_torch(tmp_path):
    """tensorboardX imports torch whenever it is installed (the test extra installs it, as
    Colab does): the writer hides it, so a run's start-up does not pay for it, and puts it
    back, so that `import torch` works afterwards. In a fresh process, since this one may
    have imported torch already."""
    assert importlib.util.find_spec("torch") is not None, "the test extra installs torch"
    code = (
        "import sys; from replax.run import metrics\n"
        f"writer = metrics.MetricsWriter({str(tmp_path)!r})\n"
        "writer.write(1, {'reward_mean': 0.5}); writer.close()\n"
        "print('torch' in sys.modules, writer._tb is not None)\n"
        "import torch; print(torch.zeros(2).sum().item())\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["False", "True", "0.0"]
    assert read_scalars(str(tmp_path)) == [("train/reward_mean", 1, 0.5)]
