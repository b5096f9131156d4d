"""The files of a study: its JSON, markdown tables, number formats, the machine it ran on."""

from __future__ import annotations

import json
import math
import os
import platform
import shlex
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np


def machine_info() -> dict[str, Any]:
    info = {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }
    try:
        import jax

        info["jax"] = jax.__version__
        info["backend"] = jax.default_backend()
        info["devices"] = [str(d) for d in jax.devices()]
    except Exception as e:  # noqa: BLE001 - information only
        info["jax_error"] = str(e)
    return info


def load_average() -> list[float] | None:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def fmt(value, kind: str = "num") -> str:
    """Table cell: 'never' for None/inf, percent, integer or short float."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "never"
    if kind == "pct":
        return f"{100 * value:.1f}%"
    if kind == "int":
        return f"{value:,.0f}"
    if kind == "lr":
        return f"{value:g}"
    return f"{value:.3g}"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write_json(path: str, payload: dict[str, Any]) -> None:
    def clean(value):
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [clean(v) for v in value]
        if isinstance(value, (np.generic, np.ndarray)):
            return clean(value.tolist())
        if isinstance(value, float) and not math.isfinite(value):
            return None
        return value

    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(clean(payload), f, indent=2)
    os.replace(tmp, path)


def write_report(workdir: str, name: str, payload: dict, text: str, plot, argv, t0, load_start):
    """A study's outputs: NAME.json (the payload with the command, the machine and the
    wall-clock), NAME.png (`plot(path)`), NAME.md (`text`, also printed)."""
    payload["command"] = shlex.join([os.path.basename(sys.executable), f"scripts/{name}.py", *argv])
    payload["machine"] = {
        **machine_info(),
        "load_average_start": load_start,
        "load_average_end": load_average(),
    }
    payload["wall_s"] = time.time() - t0
    write_json(os.path.join(workdir, f"{name}.json"), payload)
    plot(os.path.join(workdir, f"{name}.png"))
    with open(os.path.join(workdir, f"{name}.md"), "w") as f:
        f.write(text)
    print(text)
