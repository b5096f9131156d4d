r"""Trains a policy with RL and experience replay.

  python scripts/train.py --config=configs/arith.py:replay --workdir=/tmp/replax/arith \
      [--config.KEY=VALUE ...]

With no flags it runs the embedded default (configs/arith.py, replay) in runs/arith.
Without --workdir a run goes to runs/NAME: the config file's stem for its default variant
(configs/arith.py -> runs/arith), STEM-VARIANT for another
(configs/gsm8k.py:qwen2.5-0.5b-instruct -> runs/gsm8k-qwen2.5-0.5b-instruct).

Bad configuration exits with status 2 and one line on stderr naming the key, before
anything is written to the workdir. Running again with the same workdir resumes.
SIGTERM or SIGINT: the current step finishes, its checkpoint is written, and the script
exits with status 3; the same command continues the run exactly.

Several processes (one per host, docs/multihost.md): start the same command on each.
On a Cloud TPU pod slice or under SLURM nothing more is needed; elsewhere set
JAX_COORDINATOR_ADDRESS=host:port, JAX_NUM_PROCESSES and JAX_PROCESS_ID, or pass
--coordinator_address, --num_processes and --process_id. Process 0 alone writes
metrics.jsonl and TensorBoard and prints; every process writes its part of checkpoints.
A process lost mid-run stops the others within a minute with status 4 and one line naming
it and the step the same command, run again on every process, resumes from.

It prints a start-up banner (devices, meshes, bytes per device, tokens per step), then
progress: a bar on a terminal, else a line at most every log.print_every_s seconds.
absl logs ERROR and above unless --verbosity (e.g. --verbosity=0 for INFO) is given.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from replax.core import config_utils, lost_host  # noqa: E402
from replax.core.config_utils import flag_error_line as _one_line  # noqa: E402

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_DEFAULT_CONFIG = os.path.join(_ROOT, "configs", "arith.py")
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Directory for metrics, checkpoints, data (default runs/NAME)."
)
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", None, "Several processes: host:port of process 0 (else from env)."
)
_NUM_PROCESSES = flags.DEFINE_integer(
    "num_processes", None, "Several processes: how many (else JAX_NUM_PROCESSES or detected)."
)
_PROCESS_ID = flags.DEFINE_integer(
    "process_id", None, "Several processes: this one's index (else JAX_PROCESS_ID or detected)."
)


def _fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def _parse(argv):
    try:  # the config file loads here (and its --config.KEY=VALUE overrides apply)
        config_flags.DEFINE_config_file(
            "config", _DEFAULT_CONFIG, "Config file: configs/NAME.py[:VARIANT].", sys_argv=argv
        )
        return flags.FLAGS(argv)
    except Exception as e:  # noqa: BLE001 - unknown --config.KEY, bad value, bad file
        _fail(_one_line(e, argv, config_utils.config_from_argv(argv, _DEFAULT_CONFIG)))


def _several_processes() -> bool:
    if _COORDINATOR.value or (_NUM_PROCESSES.value or 1) > 1:
        return True
    return _NUM_PROCESSES.value != 1 and lost_host.is_multi_host(os.environ)


def _last_sealed_step(workdir: str) -> int | None:
    from replax.run import checkpoint

    return checkpoint.last_sealed_step(os.path.join(workdir, "checkpoints"))


def main(argv):
    del argv
    # absl's INFO lines (orbax, jax) drown the run's own: ERROR unless --verbosity says.
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.ERROR)
    from replax.config import build as configuration
    from replax.config import spec as spec_lib
    from replax.core import processes
    from replax.run import runtime, trainer
    from replax.tools import experiments

    config_flag = flags.FLAGS["config"].config_filename
    config_file = config_flag.split(":")[0]
    if not os.path.isfile(config_file):
        _fail(f"--config={config_file}: no such file (e.g. --config=configs/arith.py)")
    workdir = _WORKDIR.value or config_utils.default_workdir(config_flag, _ROOT)
    config = flags.FLAGS.config
    if _several_processes():  # before jax starts: a lost peer ends this run in one line
        lost_host.supervise(lambda: _last_sealed_step(workdir))
    import jax

    try:  # before anything asks jax for devices: validate counts them
        processes.maybe_initialize_distributed(
            coordinator_address=_COORDINATOR.value,
            num_processes=_NUM_PROCESSES.value,
            process_id=_PROCESS_ID.value,
        )
    except (ValueError, TypeError, RuntimeError) as e:
        _fail(f"jax.distributed: {_one_line(e)}")
    lost_host.watch_peers(lambda: _last_sealed_step(workdir))
    try:  # the spec checks itself, and train builds it, before anything is created
        # A task.name on the command line keeps only the file's task.* keys it can use.
        file_config = experiments.file_config(flags.FLAGS["config"].config_filename)
        spec = spec_lib.parse(configuration.fit_task_section(config, file_config))
        summary = trainer.train(spec, workdir)
    except config_utils.ConfigError as e:
        _fail(str(e))
    except runtime.Preempted as e:
        print(str(e), file=sys.stderr)
        sys.exit(runtime.EXIT_PREEMPTED)
    except jax.errors.JaxRuntimeError:
        lost_host.await_loss()  # a collective that failed for a lost peer ends here
        raise
    finally:
        lost_host.stop_watching()
    if jax.process_index() != 0:
        return
    print(
        f"base held-out accuracy {summary['base_accuracy']:.3f} -> final "
        f"{summary['final_accuracy']:.3f} "
        f"({100 * (summary['final_accuracy'] - summary['base_accuracy']):+.1f} points) "
        f"in {summary['wall_s']:.0f} s, {summary['gen_tokens']} generated tokens"
    )


if __name__ == "__main__":
    app.run(main, flags_parser=_parse)
