"""Tests for configs/gsm8k.py and configs/math.py (and their helper configs/_real_models.py):
every variant passes the config checks against a tiny stand-in checkpoint, the buffer
sizes are what the variant says, the named models' architectures are the real ones, and
bad variants are one line naming what is allowed."""

import importlib.util
import json
import math
import os
import pathlib

import jax
import ml_collections
import pytest
import tokenizers
from absl import flags
from ml_collections import config_flags

from replax.config import build as configuration
from replax.config import spec as spec_lib
from replax.core.config_utils import ConfigError
from replax.model import transformer as model_lib
from replax.tools import experiments

ROOT = pathlib.Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
FILES = ("gsm8k", "math")
_spec = importlib.util.spec_from_file_location(
    "real_models_under_test", ROOT / "configs" / "_real_models.py"
)
real_models = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(real_models)
MODELS = tuple(real_models.MODELS)
VARIANTS = [
    (name, f"{model},{algorithm},{hardware}")
    for name in FILES
    for model in MODELS
    for algorithm in ("replay", "onpolicy")
    for hardware in ("host", "pod")
]
# Parameter counts the model authors publish (Hugging Face model cards), in billions.
PUBLISHED_PARAMS = {
    "qwen2.5-0.5b-instruct": 0.49,
    "qwen2.5-1.5b-instruct": 1.54,
    "qwen2.5-7b-instruct": 7.61,
    "qwen3-0.6b": 0.60,
    "qwen3-1.7b": 1.72,
    "llama-3.2-1b-instruct": 1.24,
}


def load(name, variant=None):
    return experiments.load_config(str(ROOT / "configs" / f"{name}.py"), variant)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A stand-in Hugging Face directory: a tiny Qwen2 config.json (no weights: the config
    checks read none) and a character-level tokenizer with Qwen2.5's chat template."""
    directory = tmp_path_factory.mktemp("tiny_qwen")
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    chars = [chr(i) for i in range(32, 127)] + ["\n"]
    vocab = {t: i for i, t in enumerate(specials + ["[UNK]"] + chars)}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = tokenizers.decoders.Fuse()
    tok.add_special_tokens(specials)
    tok.save(str(directory / "tokenizer.json"))
    template = (DATA / "qwen2.5_chat_template.jinja").read_text()
    (directory / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "bos_token": None,
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "chat_template": template,
            }
        )
    )
    (directory / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["Qwen2ForCausalLM"],
                "model_type": "qwen2",
                "vocab_size": 128,
                "hidden_size": 32,
                "intermediate_size": 64,
                "num_hidden_layers": 1,
                "num_attention_heads": 2,
                "num_key_value_heads": 1,
                "max_position_embeddings": 32768,
                "rms_norm_eps": 1e-6,
                "rope_theta": 1000000.0,
                "tie_word_embeddings": True,
                "hidden_act": "silu",
            }
        )
    )
    return str(directory)


def fit_mesh(c, devices=8):
    """The variant's mesh shrunk to the simulated devices: fsdp and tensor cut to what
    divides them, data takes the rest."""
    _, fsdp, tensor = c.mesh.shape
    fsdp = math.gcd(fsdp if fsdp > 0 else devices, devices)
    tensor = math.gcd(tensor, devices // fsdp)
    c.mesh.shape = (-1, fsdp, tensor)


@pytest.fixture(scope="module")
def data_files(tmp_path_factory):
    """The tiny data files' problems, 640 with a copy number appended: with half of them
    held out (task.test_fraction=0.5), enough for a variant's 256 eval.num_prompts."""
    directory = tmp_path_factory.mktemp("data")
    for name, field in (("gsm8k", "question"), ("math", "problem")):
        records = [json.loads(line) for line in (DATA / f"{name}_tiny.jsonl").open()]
        with open(directory / f"{name}.jsonl", "w") as f:
            for copy in range(640 // len(records)):
                for r in records:
                    f.write(json.dumps({**r, field: f"{r[field]} ({copy})"}) + "\n")
    return directory


@pytest.mark.parametrize("model", MODELS)
def test_host_decodes_tensor_parallel_where_the_model_says(model):
    """A host variant decodes over (-1, 1, t) when its model names t, a width that splits
    the real model's query and kv heads; the pod and chip variants decode on their own
    training mesh."""
    t = real_models.MODELS[model].host_decode_tensor
    arch = real_models.MODELS[model].architecture
    for name in ("gsm8k", "math"):
        host = load(name, f"{model},host")
        assert host.rollout.mesh_shape == ((-1, 1, t) if t > 1 else ())
        assert arch["num_kv_heads"] % t == 0 and arch["num_heads"] % t == 0
        for hardware in ("pod",) + (("chip",) if model == "qwen2.5-0.5b-instruct" else ()):
            assert load(name, f"{model},{hardware}").rollout.mesh_shape == ()
    assert {m for m in MODELS if real_models.MODELS[m].host_decode_tensor > 1} == {
        "qwen2.5-7b-instruct",
        "qwen3-1.7b",
    }


@pytest.mark.parametrize("name, variant", VARIANTS)
def test_every_variant_passes_the_config_checks(name, variant, checkpoint, data_files):
    c = load(name, variant)
    assert c.model.init == "checkpoint" and c.model.checkpoint == ""
    assert c.task.data_path is None  # the user's; MathTask says so when it is missing
    c.model.checkpoint = checkpoint
    c.task.data_path = str(DATA / f"{name}_tiny.jsonl")
    if variant.endswith("pod"):
        fit_mesh(c)
    if c.rollout.mesh_shape:  # the tiny checkpoint's one kv head splits over no chips
        c.rollout.mesh_shape = (-1, 1, 1)
    # The build step counts the file's problems against a step's and the evaluation's.
    with pytest.raises(ConfigError, match=r"is more than the \d+ (train|held-out) examples"):
        configuration.validate(c)
    c.task.data_path = str(data_files / f"{name}.jsonl")
    c.task.test_fraction = 0.5
    configuration.validate(c)

    r = c.rollout.prompts_per_step * c.rollout.group_size
    b, n = c.train.batch_size, c.replay.capacity
    if "onpolicy" in variant:
        assert n == b == r and c.replay.strategy == "uniform_no_replacement"
    else:
        assert r < b < n and c.replay.strategy == "positive_bias"
        assert (b // r, n // r) == (2, 8)  # y = B / R, x = N / R
    assert r >= (512 if variant.endswith("pod") else 64)
    assert c.rollout.max_prompt_len + c.rollout.max_new_tokens == c.model.max_len
    assert (c.model.dtype, c.model.param_dtype) == ("bfloat16", "float32")
    assert c.eval.every > 0 and c.total_steps % c.eval.every == 0


def test_replay_and_onpolicy_generate_the_same_rollouts():
    for name in FILES:
        for hardware in ("host", "pod"):
            runs = [load(name, f"{a},{hardware}") for a in ("replay", "onpolicy")]
            rollouts = [
                c.total_steps * c.rollout.prompts_per_step * c.rollout.group_size for c in runs
            ]
            assert rollouts[0] == rollouts[1]


def test_defaults_and_part_order():
    for name in FILES:
        default = load(name).to_dict()
        assert default == load(name, "qwen2.5-1.5b-instruct,replay,host").to_dict()
        assert load(name, " POD , qwen3-0.6b ").to_dict() == load(name, "qwen3-0.6b,pod").to_dict()
    assert load("gsm8k").task.name == "gsm8k" and load("math").task.name == "math"
    # Qwen3 is asked to answer without thinking; the others get the field's instruction.
    assert load("math", "qwen3-1.7b").task.instruction.endswith("\\boxed{}. /no_think")
    assert load("math").task.instruction is None


@pytest.mark.parametrize(
    "variant, words",
    [
        ("qwen9-1b", ["'qwen9-1b'", "qwen2.5-0.5b-instruct", "onpolicy", "pod"]),
        ("replay,tpu", ["'tpu'", "host, chip, pod"]),
        ("replay,onpolicy", ["two algorithms", "'replay', 'onpolicy'"]),
        ("qwen3-0.6b,qwen3-1.7b", ["two models"]),
    ],
)
def test_unknown_variant_parts_are_one_line_naming_the_allowed(variant, words):
    for name in FILES:
        with pytest.raises(ConfigError) as error:
            load(name, variant)
        message = str(error.value)
        assert "\n" not in message and all(w in message for w in words), message


def _docstring(name):
    return (ROOT / "configs" / f"{name}.py").read_text().split('"""')[1]


def test_the_docstring_launch_command_names_the_file():
    for name in FILES:
        docstring = _docstring(name)
        assert f"python scripts/train.py --config=configs/{name}.py:" in docstring
        assert "--config.model.checkpoint=" in docstring and "--config.task.data_path=" in docstring
    # One table of the variants, configs/gsm8k.py's; configs/math.py points to it.
    assert "those of configs/gsm8k.py, whose docstring's table" in _docstring("math")
    for model in MODELS:
        assert model in _docstring("gsm8k")


def test_every_key_the_trainer_reads_is_there():
    """Every key of the embedded default (configs/arith.py) except its task's own."""
    arith = experiments.load_config(str(ROOT / "configs" / "arith.py"), None)

    def keys(c, prefix=""):
        out = set()
        for k, v in c.items():
            if isinstance(v, ml_collections.ConfigDict):
                out |= keys(v, f"{prefix}{k}.")
            else:
                out.add(prefix + k)
        return out

    wanted = {k for k in keys(arith) if not k.startswith("task.")}
    wanted |= {f"task.{k}" for k in spec_lib.TASK_DATA_KEYS}
    for name in FILES:
        for variant in ("replay,host", "onpolicy,pod"):
            missing = wanted - keys(load(name, variant))
            assert not missing, (name, variant, sorted(missing))


@pytest.mark.parametrize("model", MODELS)
def test_architecture_keys_are_the_named_model(model, checkpoint, data_files):
    """Without a checkpoint the model.* keys build the ModelConfig: it passes the checks
    and has the published number of parameters."""
    c = load("gsm8k", model)
    c.model.init, c.model.checkpoint = "random", ""
    c.tokenizer.path = checkpoint
    c.task.data_path, c.task.test_fraction = str(data_files / "gsm8k.jsonl"), 0.5
    configuration.validate(c)
    config = configuration.model_config(spec_lib.parse(c).model)
    tokens = jax.numpy.zeros((1, 8), "int32")
    shapes = jax.eval_shape(
        lambda: model_lib.Transformer(config).init(jax.random.key(0), tokens, tokens)
    )
    count = sum(math.prod(x.shape) for x in jax.tree.leaves(shapes))
    assert count / 1e9 == pytest.approx(PUBLISHED_PARAMS[model], rel=0.02)


@pytest.mark.filterwarnings("ignore:the load_module")  # ml_collections' config loader
def test_the_command_line_form_overrides_the_user_keys():
    """`--config=configs/gsm8k.py:MODEL,onpolicy --config.task.data_path=...` as
    scripts/train.py parses it (the unset paths take a string from the command line)."""
    argv = [
        "train",
        f"--config={ROOT / 'configs' / 'gsm8k.py'}:qwen2.5-0.5b-instruct,onpolicy",
        "--config.model.checkpoint=/ckpt",
        "--config.task.data_path=/data/gsm8k",
        "--config.task.system_prompt=Be brief.",
    ]
    values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", flag_values=values, sys_argv=argv)
    values(argv)
    c = values.config
    assert (c.model.checkpoint, c.task.data_path, c.task.system_prompt) == (
        "/ckpt",
        "/data/gsm8k",
        "Be brief.",
    )
    assert c.train.batch_size == c.replay.capacity == 256
    assert os.path.basename(values["config"].config_filename).startswith("gsm8k.py:")


def test_the_docstring_table_is_the_config():
    """Each model's row of configs/gsm8k.py's docstring table: G, lr, host and pod replay
    R / B / N and the pod's fsdp, as each config (configs/math.py points to it) has them."""
    rows = {line.split()[0]: line for line in _docstring("gsm8k").splitlines() if "|" in line}
    assert not [line for line in _docstring("math").splitlines() if "|" in line]
    for name in FILES:
        for model in MODELS:
            host, pod = load(name, f"{model},host"), load(name, f"{model},pod")

            def rbn(c):
                r = c.rollout.prompts_per_step * c.rollout.group_size
                return f"{r} / {c.train.batch_size} / {c.replay.capacity}"

            g = host.rollout.group_size
            lr = f"{host.optimizer.learning_rate:.0e}".replace("e-0", "e-")  # 3e-6
            expected = f"{model} {g} {lr} | {rbn(host)} | {rbn(pod)}, {pod.mesh.shape[1]}"
            assert " ".join(rows[model].split()) == expected


@pytest.mark.parametrize("name", ["gsm8k", "math"])
def test_missing_or_malformed_data_is_one_line_before_any_compute(name, checkpoint, tmp_path):
    from replax.core.config_utils import ConfigError

    c = load(name, "qwen2.5-0.5b-instruct")
    c.model.checkpoint = checkpoint
    with pytest.raises(ConfigError, match="task.data_path") as error:
        configuration.validate(c)  # no data_path
    assert "\n" not in str(error.value)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "answer": "#### 1"}\n{not json\n')
    c.task.data_path = str(bad)
    with pytest.raises(ConfigError, match=r"bad\.jsonl:2"):
        configuration.validate(c)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    c.task.data_path = str(empty)
    with pytest.raises(ConfigError) as error:
        configuration.validate(c)
    assert str(error.value) == f"task.data_path={str(empty)!r}: {empty} is empty (no examples)"


def test_smollm2_config_builds_and_its_variants_generate_the_same_rollouts(checkpoint, tmp_path):
    """configs/smollm2.py passes the config checks against the stand-in checkpoint (its
    word-problem task through the stand-in's chat template); on-policy is N = B = R over
    the replay variant's rollouts; a missing model directory is one line naming the key."""
    runs = {v: load("smollm2", v) for v in ("replay", "onpolicy")}
    assert load("smollm2").to_dict() == runs["replay"].to_dict()
    for c in runs.values():
        assert c.model.checkpoint.endswith(os.path.join("runs", "smollm2-135m-instruct"))
        c.model.checkpoint = checkpoint
        # The stand-in's small tokenizer spends about 3x SmolLM2's tokens on a prompt.
        c.rollout.max_prompt_len = 320
        c.model.max_len = 320 + c.rollout.max_new_tokens
        configuration.validate(c)
        assert c.task.name == "word_problems" and c.model.dtype == "float32"
        # pass@8 and entropy on at least 64 held-out prompts (one prompt: 1.6 points).
        assert c.eval.pass_k == 8 and c.eval.pass_k_prompts >= 64
    replay, onpolicy = runs["replay"], runs["onpolicy"]
    r = replay.rollout.prompts_per_step * replay.rollout.group_size
    assert (r, replay.train.batch_size, replay.replay.capacity) == (16, 32, 128)
    r_on = onpolicy.rollout.prompts_per_step * onpolicy.rollout.group_size
    assert r_on == onpolicy.train.batch_size == onpolicy.replay.capacity == 32
    assert replay.total_steps * r == onpolicy.total_steps * r_on
    assert onpolicy.replay.strategy == "uniform_no_replacement"
    missing = load("smollm2")
    missing.model.checkpoint = str(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match="model.checkpoint") as error:
        configuration.validate(missing)
    assert "\n" not in str(error.value)
