"""Tests for replax/tools/tpu_targets.py: slice names, chips' figures, the roofline."""

import pytest

from replax.tools import tpu_targets


def test_chip_table_and_slices():
    v5e = tpu_targets.target("v5e-8")  # a Cloud name: one host of 8 chips
    assert (v5e.name, v5e.chips, v5e.hosts, len(v5e.devices)) == ("v5e:2x4", 8, 1, 8)
    assert v5e.hbm_bytes_per_device == 16 * 2**30
    pod = tpu_targets.target("v5e:4x4")  # 4 hosts of 4 chips
    assert (pod.chips, pod.hosts) == (16, 4)
    assert tpu_targets.target("v5p:2x2x1").chip.hbm_bytes == 95 * 10**9


def test_roofline_takes_the_bound_that_binds():
    chip = tpu_targets.Chip(hbm_bytes=1, bf16_flops_per_s=100.0, hbm_bytes_per_s=10.0)
    assert tpu_targets.roofline_s(1000.0, 10.0, chip) == 10.0  # compute-bound
    assert tpu_targets.roofline_s(10.0, 1000.0, chip) == 100.0  # bandwidth-bound


def test_slice_names_without_libtpu():
    assert tpu_targets.slice_chips("v5p-128") == ("v5p", 64)  # TensorCores in the name
    assert tpu_targets.slice_chips("v5e:2x2") == ("v5e", 4)
    with pytest.raises(ValueError, match="unknown; known are v5e:1x1"):
        tpu_targets.slice_chips("v9:2x2")
