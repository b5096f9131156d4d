r"""Auto replay against on-policy and the fixed default design, at several mu.

  python scripts/auto_mu.py --workdir=/tmp/replax/auto_mu [--seeds=3] [--mus=0.5,1,2,6] \
      [--budget_rollouts=0] [--num_evals=16] [--out=docs/results/auto_mu.json]

Runs, through scripts/compare.py (one study directory, resumable: finished runs are
skipped), on the embedded default (configs/arith.py) at the config's learning rate:
`onpolicy`, `replay` (the fixed default design) and, for each mu, `auto_muMU`: the
default with replay.mode='auto' planning for that mu (replay.mu). On-policy's and the
fixed design's runs do not depend on mu, so their costs at every mu come from the same
runs. The target is on-policy's median final accuracy; each side's cost is the same-basis
cost T + mu G at its own first reach (replax/tools/same_basis.py: `auto_mu_table`).

Writes DIR/compare.json (and the rest compare.py writes) and --out: `{"mu": {"0.5":
{"auto": C, "onpolicy": C, "fixed": C, "cheaper", "auto_over_cheaper",
"within_tolerance", "per_seed"}, ...}, "commit", "command", ...}`, C the median over seeds
(null when the median seed never reaches the target). --variants=NAME,NAME runs only those
(e.g. two processes sharing the cores) and writes no --out; --partial=WHY marks the JSON
as a study cut short (`partial`, `partial_reason`). --reuse=DIR[,DIR] takes finished runs
of equal settings from other studies (compare.py's --reuse), e.g. on-policy's and the fixed
design's when only auto mode changed.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import compare  # noqa: E402

from replax.tools import report as report_lib  # noqa: E402
from replax.tools import same_basis  # noqa: E402

FLAGS = (
    "workdir", "seeds", "mus", "budget_rollouts", "num_evals", "out", "variants", "partial",
    "reuse",
)  # fmt: skip


def parse_args(argv: list[str]) -> dict[str, str]:
    """--FLAG=VALUE pairs of FLAGS; ValueError (one line) for anything else."""
    args = {"seeds": "3", "mus": "0.5,1,2,6", "budget_rollouts": "0", "num_evals": "16"}
    args.update(out="", variants="", partial="", reuse="")
    for item in argv:
        name, sep, value = item.removeprefix("--").partition("=")
        if not item.startswith("--") or not sep or name not in FLAGS:
            raise ValueError(f"{item}: expected --FLAG=VALUE, FLAG one of {', '.join(FLAGS)}")
        args[name] = value
    if not args.get("workdir"):
        raise ValueError("--workdir is required")
    try:
        mus = [float(m) for m in args["mus"].split(",")]
    except ValueError:
        mus = []
    if not mus or any(not m > 0 for m in mus):
        raise ValueError(f"--mus={args['mus']}: allowed are numbers > 0, comma-separated")
    args["mu_list"] = mus
    return args


def auto_variant(mu: float) -> str:
    return f"auto_mu{mu:g}"


def compare_argv(args: dict, variants: list[str]) -> list[str]:
    """compare.py's command line for these variants: one learning rate each (the config's,
    1e-4), auto variants defined from the default with their mu."""
    argv = [
        f"--workdir={args['workdir']}",
        f"--seeds={args['seeds']}",
        f"--num_evals={args['num_evals']}",
        f"--budget_rollouts={args['budget_rollouts']}",
        f"--variants={','.join(variants)}",
        "--lr_grid=" + ";".join(f"{v}:1e-4" for v in variants),
    ]
    if args.get("reuse"):
        argv.append(f"--reuse={args['reuse']}")
    for mu in args["mu_list"]:
        name = auto_variant(mu)
        if name in variants:
            argv += [f"--define={name}=replay", f"--override={name}:replay.mode=auto"]
            argv += [f"--override={name}:replay.mu={mu:g}"]
    return argv


def commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True)
        return out.stdout.decode().strip() or None
    except OSError:
        return None


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = parse_args(argv)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    every = ["onpolicy", "replay", *(auto_variant(mu) for mu in args["mu_list"])]
    variants = [v.strip() for v in args["variants"].split(",") if v.strip()] or every
    unknown = [v for v in variants if v not in every]
    if unknown:
        print(f"error: --variants: {unknown[0]} is not one of {', '.join(every)}", file=sys.stderr)
        return 2
    subset = [] if variants == every else ["--target=1"]  # runs only: no report needed
    rc = compare.main(compare_argv(args, variants) + subset)
    if rc or variants != every or not args["out"]:
        return rc
    with open(os.path.join(args["workdir"], "compare.json")) as f:
        payload = json.load(f)
    auto = {mu: auto_variant(mu) for mu in args["mu_list"]}
    out = {
        "mu": same_basis.auto_mu_table(payload, auto),
        "commit": commit(),
        # A study cut short (fewer seeds or a smaller budget than planned) says so.
        "partial": bool(args["partial"]),
        "partial_reason": args["partial"] or None,
        "command": "python scripts/auto_mu.py " + shlex.join(argv),
        "target_accuracy": payload["target_accuracy"],
        "seeds": payload["seeds"],
        "budget_rollouts": payload["budget_rollouts"],
        "tolerance": same_basis.AUTO_TOLERANCE,
        "cost": "T + mu G at each side's own first reach (rollouts trained, generated)",
        "final_accuracy": {v: payload["variants"][v]["per_seed"]["final_accuracy"] for v in every},
    }
    report_lib.write_json(args["out"], out)
    print(json.dumps(out["mu"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
