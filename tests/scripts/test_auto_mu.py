"""scripts/auto_mu.py's command line: what it hands compare.py, and bad flags."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import auto_mu  # noqa: E402


def test_each_auto_variant_is_the_default_in_auto_mode_at_its_mu_and_reuse_passes_through():
    args = auto_mu.parse_args(["--workdir=W", "--mus=0.5,6", "--reuse=A,B"])
    argv = auto_mu.compare_argv(args, ["onpolicy", "auto_mu0.5", "auto_mu6"])
    assert "--variants=onpolicy,auto_mu0.5,auto_mu6" in argv and "--reuse=A,B" in argv
    assert "--lr_grid=onpolicy:1e-4;auto_mu0.5:1e-4;auto_mu6:1e-4" in argv
    for mu in ("0.5", "6"):
        assert f"--define=auto_mu{mu}=replay" in argv
        assert f"--override=auto_mu{mu}:replay.mode=auto" in argv
        assert f"--override=auto_mu{mu}:replay.mu={mu}" in argv
    assert not any(a.startswith("--reuse") for a in auto_mu.compare_argv(
        auto_mu.parse_args(["--workdir=W"]), ["onpolicy"]))  # fmt: skip


@pytest.mark.parametrize(
    "argv, named",
    [(["--workdir=W", "--mus=0,1"], "--mus"), (["--workdir=W", "--reused=A"], "--reused")],
)
def test_a_bad_flag_is_one_line_and_exit_2(argv, named):
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "auto_mu.py"), *argv],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and named in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
