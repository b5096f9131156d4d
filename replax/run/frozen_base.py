"""A LoRA run's frozen base: kept out of the step checkpoints, stored or named once.

With LoRA on only the adapters train, so a step's checkpoint holds the train state with
the adapters alone as its params (`stored`), beside their Adam state, the replay store
and the loop state; the base, which never changes, is not written again at every step.
Where it comes from decides how a resumed run gets it back:
- `model.init='checkpoint'`: the Hugging Face directory is the base. The loop state's
  `lora_base` names it (directory name and fingerprint) and a resume reads it again from
  there, after checking that its fingerprint is still the one the adapters were trained
  on;
- a random or warm-started base: written once, when the run starts, to WORKDIR/lora_base/
  (`params`, an orbax checkpoint, and `fingerprint.json`), and restored from there, its
  fingerprint checked against the loop state's.
A base that does not match stops the run with one line (ConfigError), before a step.
Without LoRA everything here passes the train state through unchanged.
"""

from __future__ import annotations

import json
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath

from replax.core import processes
from replax.core.config_utils import ConfigError
from replax.core.sharding import abstract_like
from replax.hf import adapters
from replax.model import lora

BASE_DIR = "lora_base"
FINGERPRINT = "fingerprint.json"


def stored(run, train_state):
    """The train state as a step's checkpoint holds it: with LoRA, the adapters alone as
    its params (arrays or ShapeDtypeStructs alike)."""
    if not lora.enabled(run.model_config):
        return train_state
    return train_state.replace(params=lora.partition(train_state.params, True)[0])


def whole(run, train_state, base):
    """The inverse of `stored`: the adapters put back on their base."""
    if not lora.enabled(run.model_config):
        return train_state
    return train_state.replace(params=lora.combine(train_state.params, base))


def fingerprint(run, params) -> dict[str, str] | None:
    """With LoRA, the loop state's `lora_base`: the base's source and a hash of a few of
    its tensors (`lora.fingerprint_of_params`); the model.checkpoint directory's own for
    a base read from there. None without LoRA."""
    if not lora.enabled(run.model_config):
        return None
    spec = run.spec
    if spec.model.init == "checkpoint":
        return adapters.fingerprint_of_checkpoint(spec.model.checkpoint)
    return lora.fingerprint_of_params(params, f"{spec.model.init} seed {spec.seed}")


def _base_path(run) -> epath.Path:
    """WORKDIR/lora_base: a local directory made absolute (orbax wants one), a URL as it is."""
    path = epath.Path(run.workdir) / BASE_DIR
    return path if "://" in str(run.workdir) else path.absolute()


def save_base(run, params) -> dict[str, str] | None:
    """A new run's base, stored once when it does not come from model.checkpoint. Every
    process takes part (orbax). Returns the run's `lora_base` fingerprint."""
    found = fingerprint(run, params)
    if found is None or run.spec.model.init == "checkpoint":
        return found
    path = _base_path(run)
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(path / "params", lora.without_adapters(params), force=True)
    checkpointer.wait_until_finished()
    if jax.process_index() == 0:
        (path / FINGERPRINT).write_text(json.dumps(found))
    processes.barrier("replax lora base written")
    return found


def load_base(run, saved: dict[str, str] | None, abstract_params):
    """The base a checkpoint's adapters belong to, in the shardings of `abstract_params`
    (the whole params' ShapeDtypeStructs); None without LoRA. Raises ConfigError, one
    line, when it is missing or is not the base named by `saved` (the loop state's
    `lora_base`)."""
    if not lora.enabled(run.model_config):
        return None
    spec = run.spec
    if spec.model.init == "checkpoint":
        _check(saved, fingerprint(run, None), f"model.checkpoint={spec.model.checkpoint!r}")
        from replax.hf import checkpoint as hf

        _, params = hf.load_pretrained_sharded(
            spec.model.checkpoint, run.mesh, run.rules, **spec.model.checkpoint_overrides()
        )
        return lora.without_adapters(params)
    path = _base_path(run)
    where = f"{path} (model.init={spec.model.init!r})"
    if not (path / FINGERPRINT).exists():
        raise ConfigError(
            f"the checkpoint's adapters need their frozen base, {where}, which is missing: "
            "restore it or use a new workdir"
        )
    target = abstract_like(lora.without_adapters(abstract_params))
    base = ocp.StandardCheckpointer().restore(path / "params", target)
    source = saved["source"] if saved else f"{spec.model.init} seed {spec.seed}"
    _check(saved, lora.fingerprint_of_params(base, source), where)
    return base


def _check(saved: dict[str, str] | None, current: dict[str, str], where: str) -> None:
    if saved is not None and saved["sha256"] == current["sha256"]:
        return
    held = "no LoRA base" if saved is None else f"{saved['source']} ({saved['sha256'][:12]})"
    raise ConfigError(
        f"the checkpoint's adapters belong to {held}, not to the base of {where} "
        f"({current['source']}, {current['sha256'][:12]}): use a new workdir"
    )


def restore_train_state(run, checkpointer, step: int, abstract_train_state) -> Any:
    """A step's whole train state (the adapters on their base, with LoRA): what evaluation
    and export read. `abstract_train_state`: the run's, as `assemble.abstract_states`."""
    state = checkpointer.restore_train_state(step, train_state=stored(run, abstract_train_state))
    if not lora.enabled(run.model_config):
        return state
    args = ocp.args.Composite(loop_state=ocp.args.JsonRestore())
    saved = checkpointer.manager.restore(step, args=args)["loop_state"].get("lora_base")
    return whole(run, state, load_base(run, saved, abstract_train_state.params))
