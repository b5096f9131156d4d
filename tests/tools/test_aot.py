"""scripts/tpu_compile.py and replax/tools/aot.py: a run's programs compiled by libtpu's TPU
compiler for a v5e:2x2 slice on this CPU host, with the compiler's memory and cost
figures; bad input as one line and exit 2; the chip table and the roofline model."""

import json
import os
import subprocess
import sys

import pytest

from replax.tools import aot, tpu_targets

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "tpu_compile.py")
# The embedded task's config at a micro size: what the programs are, not how large.
MICRO = [
    "--config.model.num_layers=2",
    "--config.model.d_model=64",
    "--config.model.mlp_dim=128",
    "--config.rollout.prompts_per_step=4",
    "--config.train.batch_size=16",
    "--config.replay.capacity=64",
    "--config.eval.num_prompts=16",
    "--config.eval.pass_k_prompts=4",
]
CORE = "train_step,sampler_prefill,sampler_decode,replay_add_and_sample"


def tpu_compile(*args, timeout=600):
    return subprocess.run(
        [sys.executable, SCRIPT, "--config=" + os.path.join(ROOT, "configs", "arith.py"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def test_the_micro_run_compiles_for_v5e_and_fits(tmp_path):
    out = tmp_path / "v5e.json"
    proc = tpu_compile("--topology=v5e:2x2", f"--programs={CORE}", f"--out={out}", *MICRO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert (result["topology"], result["chips"], result["hosts"]) == ("v5e:2x2", 4, 1)
    assert result["hbm_bytes_per_chip"] == 16 * 2**30 and result["fits"] is True
    assert set(result["programs"]) == set(CORE.split(","))
    for name, p in result["programs"].items():
        keys = ("temp_bytes", "argument_bytes", "output_bytes", "flops", "bytes_accessed")
        assert all(k in p for k in (*keys, "peak_bytes_per_chip", "compile_s")), name
        # The peak holds at least the arguments a device keeps (its shard of the weights).
        assert 0 < p["argument_bytes"] <= p["peak_bytes_per_chip"] < 0.9 * 16 * 2**30, name
        assert p["bytes_accessed"] > 0, name
        # In the run the train state and the store stay resident beside each program.
        assert p["peak_in_run_bytes_per_chip"] >= p["peak_bytes_per_chip"], name
    resident = result["resident_bytes_per_chip"]
    assert resident["train_state"] > resident["train_params"] > 0 and resident["replay_store"] > 0
    # The train step multiplies matrices; its arguments are the donated train state.
    train = result["programs"]["train_step"]
    assert train["flops"] > 1e6 and train["alias_bytes"] > 0
    assert result["train_mesh"] == {"data": 4, "fsdp": 1, "tensor": 1}
    assert result["modelled"]["mu"] > 0
    assert "train_step" in proc.stdout and "modelled" in proc.stdout


def test_a_program_that_fits_alone_but_not_beside_the_resident_state_does_not_fit(tmp_path):
    # A store of 3e8 rollouts is resident beside every program: about 16.5 GiB per device
    # of a v5e's 16, while the train step alone needs a few MiB.
    out = tmp_path / "v5e.json"
    micro = [a for a in MICRO if not a.startswith("--config.replay.capacity")]
    proc = tpu_compile(
        "--topology=v5e:2x2",
        "--programs=train_step",
        f"--out={out}",
        "--config.replay.capacity=300000000",
        *micro,
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    train = result["programs"]["train_step"]
    hbm = result["hbm_bytes_per_device"]
    assert train["peak_bytes_per_chip"] < 0.01 * hbm  # alone it fits many times over
    assert train["peak_in_run_bytes_per_chip"] > tpu_targets.FIT_FRACTION * hbm
    assert train["fits"] is False and result["fits"] is False
    assert result["resident_bytes_per_chip"]["replay_store"] > tpu_targets.FIT_FRACTION * hbm
    assert "train_step: peak" in proc.stderr and "in run is over 90%" in proc.stderr


def test_splash_attention_compiles_on_a_sharded_slice():
    # Rows over fsdp 2, heads over tensor 2: the Mosaic kernel runs under shard_map.
    proc = tpu_compile(
        "--topology=v5e:2x2",
        "--programs=train_step,sampler_prefill",
        "--config.model.attention=splash",
        "--config.mesh.shape=(1,2,2)",
        *MICRO,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "did not compile" not in proc.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--topology=v9x:2x2"], "known are v5e:1x1, v5e:2x2"),
        (["--topology=v5e:2x2", "--config.mesh.shape=(1,3,1)"], "--topology=v5e:2x2 (4 devices"),
        (["--topology=v5e:2x2", "--programs=nope"], "this run's programs are train_step"),
        ([], "--topology is required"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message):
    proc = tpu_compile(*args)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr


def test_without_libtpu_it_says_what_to_install(tmp_path):
    # A libtpu that cannot be imported, as on a plain install.
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['libtpu'] = None\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    proc = subprocess.run(
        [sys.executable, SCRIPT, "--topology=v5e:2x2"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 2
    assert "pip install -e '.[tpu]'" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_mean_cache_len_follows_the_decode_segments():
    # 64 new tokens in segments ending at 16, 32, 48, 64: a prompt of P = 9 reads
    # 8 + 16, 8 + 32, 8 + 48 and 8 + 64 slots, 16 steps each.
    assert aot._mean_cache_len(9, 64) == (24 + 40 + 56 + 72) / 4


def test_mu_model_flag_takes_a_number_or_a_config_on_a_slice():
    assert aot.parse_mu_model("6") is None
    assert aot.parse_mu_model("tpu:configs/gsm8k.py:qwen2.5-1.5b-instruct:v5e:2x4") == (
        "configs/gsm8k.py:qwen2.5-1.5b-instruct",
        "v5e:2x4",
    )
    assert aot.parse_mu_model("tpu:configs/arith.py:v5e-8") == ("configs/arith.py", "v5e-8")
    with pytest.raises(ValueError, match="tpu:CONFIG_FILE"):
        aot.parse_mu_model("tpu:configs/arith.py")


def test_modelled_mu_of_a_config_and_its_longer_completions():
    # Generating a rollout costs N decode steps, training on it one pass over P + N
    # tokens: longer completions add decode steps, so generation's share (mu) grows.
    config = os.path.join(ROOT, "configs", "arith.py")
    short = aot.modelled_mu_of_config(config, "v5e:2x2")
    longer = aot.modelled_mu_of_config(config, "v5e:2x2", {"rollout.max_new_tokens": 22})
    assert longer["mu"] > short["mu"]
    assert short["mu"] > 0 and short["generation_s"] > short["prefill_s"] > 0
    chip = tpu_targets.CHIPS["v5e"]
    # The decode step of the embedded model reads more bytes than it has FLOPs for: its
    # time is the bandwidth bound (weights and cache over 819 GB/s).
    assert short["decode_step_s"] >= tpu_targets.roofline_s(0.0, 1.0, chip)


def test_peak_in_run_adds_the_resident_state_a_program_does_not_take():
    resident = {"train_state": 100, "replay_store": 10, "train_params": 25}
    figures = {"peak_bytes_per_chip": 150}
    # The train step takes the train state: beside it only the store.
    assert aot.peak_in_run(figures, aot.Program(None, ("train_state",)), resident) == 160
    # A decode program takes neither: both are resident beside it.
    assert aot.peak_in_run(figures, aot.Program(None), resident) == 260
    # The weight cast reads the train state's weights.
    assert aot.peak_in_run(figures, aot.Program(None, ("train_params",)), resident) == 235
