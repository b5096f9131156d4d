"""Local GSM8K and MATH data: JSONL, parquet and saved Hugging Face datasets.

`read_gsm8k` / `read_math` read a JSONL file, a parquet file (pyarrow) or a saved
Hugging Face `datasets` directory (datasets.load_from_disk); GSM8K records have
question / answer, MATH records problem / solution (and optionally answer). A malformed
record or a missing file raises a ValueError naming the file and the 1-based line (row).
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

from absl import logging

from replax.tasks.answers import gsm8k_reference, last_boxed
from replax.tasks.base import Example


def is_saved_dataset(path: pathlib.Path) -> bool:
    return path.is_dir() and any(
        (path / name).is_file() for name in ("dataset_dict.json", "state.json")
    )


def read_records(path: str | os.PathLike, split: str | None = None) -> list[tuple[str, Any]]:
    """(where, record) pairs of a JSONL file, a parquet file or a saved `datasets` directory;
    `where` is "FILE:LINE" (1-based; "FILE:ROW" for parquet and datasets rows). A saved
    DatasetDict needs `split`. Raises ValueError naming the file (and line) on bad input."""
    path = pathlib.Path(path)
    if is_saved_dataset(path):
        try:
            import datasets
        except ImportError:
            raise ValueError(
                f"{path} is a saved datasets directory: reading it needs `pip install datasets`"
            ) from None
        data = datasets.load_from_disk(str(path))
        if isinstance(data, datasets.DatasetDict):
            if split not in data:
                raise ValueError(f"{path}: no split {split!r}; it has {sorted(data)}")
            data = data[split]
        return [(f"{path}:{i}", record) for i, record in enumerate(data, start=1)]
    if not path.is_file():
        raise ValueError(f"{path}: no such file (a JSONL or parquet file, or a saved dataset)")
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ValueError(f"{path}: reading parquet needs `pip install pyarrow`") from None
        try:
            rows = pq.read_table(path).to_pylist()
        except Exception as e:  # noqa: BLE001 - pyarrow's own error types
            raise ValueError(f"{path}: not a readable parquet file ({e})") from None
        return [(f"{path}:{i}", record) for i, record in enumerate(rows, start=1)]
    out = []
    try:
        with path.open(encoding="utf-8") as f:
            for line_number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    out.append((f"{path}:{line_number}", json.loads(line)))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{line_number}: not JSON ({e.msg})") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e.reason})") from None
    return out


def _field(where: str, record: Any, name: str, kind: str) -> str:
    if not isinstance(record, dict):
        raise ValueError(f"{where}: malformed {kind} record (not an object)")
    value = record.get(name)
    if not isinstance(value, str):
        raise ValueError(f"{where}: malformed {kind} record ({name!r} is not a string)")
    return value


def read_gsm8k(path: str | os.PathLike, split: str | None = None) -> list[Example]:
    """GSM8K examples: prompt = the question, answer = the text after "####" (no commas)."""
    out = []
    for where, record in read_records(path, split):
        question = _field(where, record, "question", "GSM8K")
        solution = _field(where, record, "answer", "GSM8K")
        if "####" not in solution:
            raise ValueError(f'{where}: malformed GSM8K record (answer has no "####")')
        out.append(Example(prompt=question, answer=gsm8k_reference(solution)))
    return out


def read_gsm8k_jsonl(path: str | os.PathLike) -> list[Example]:
    """`read_gsm8k` of a JSONL file (kept for existing callers)."""
    return read_gsm8k(path)


def read_math(path: str | os.PathLike, split: str | None = None) -> list[Example]:
    """MATH examples: prompt = the problem, answer = the `answer` field if present, else
    the last \\boxed{...} of the solution. A solution whose last box is empty (two of the
    real MATH train set's 7,500) has no answer to grade against: the example is left out
    with a warning naming how many; a solution with no box at all is a malformed record."""
    out, empty = [], []
    for where, record in read_records(path, split):
        problem = _field(where, record, "problem", "MATH")
        answer = record.get("answer")
        if not isinstance(answer, str) or not answer.strip():
            answer = last_boxed(_field(where, record, "solution", "MATH"))
            if answer is None:
                raise ValueError(
                    f"{where}: malformed MATH record (no answer, no \\boxed in solution)"
                )
            if not answer.strip():
                empty.append(where)
                continue
        out.append(Example(prompt=problem, answer=answer.strip()))
    if empty:
        logging.warning(
            "%d MATH records have an empty \\boxed{} and no answer, left out (first: %s)",
            len(empty),
            empty[0],
        )
    return out
