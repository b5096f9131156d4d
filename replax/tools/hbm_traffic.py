"""The HBM bytes a compiled TPU program moves, read off its optimised HLO.

`compiled.cost_analysis()["bytes accessed"]` is not a program's HBM traffic on a TPU: it
counts a loop's body once whatever its trip count (the layers under nn.scan are a loop),
and it counts on-chip traffic too: an operand staged into VMEM by a prefetch is counted
where it is copied and again where it is read. A single 2 MiB matmul reports 10 MiB.
`hbm_bytes(compiled.as_text())` counts instead, for each instruction the program runs,
the bytes it reads from and writes to buffers in HBM (memory space 0; the compiler's
layouts mark VMEM and the other on-chip spaces `S(n)`), each while loop's body times the
constant its condition compares a value against (i < n: its bound, so a loop that may
also stop on the data, as a chunk of K decode steps does, is counted at its bound):

- a fusion reads each HBM operand whole, except where it only slices it (dynamic-slice,
  slice, gather: the slices' bytes) or updates it in place (dynamic-update-slice: the
  update's bytes, and nothing read), and writes each HBM output whole (an in-place
  update: the update's bytes; an output that is its operand passed through: nothing);
- copies, slices, collectives and their asynchronous starts read their HBM source and
  write their HBM destination; tuples, bitcasts, parameters and `-done` halves move
  nothing of their own;
- a conditional costs its costliest branch; a loop whose condition compares against no
  constant (it stops on the data alone) is counted once and named in
  `unknown_trip_counts`.

It is a model of the compiled program, not a measurement: a fusion that reads an operand
twice, or the runtime's own transfers, are not seen.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import defaultdict

_BYTES = {
    "pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "bf16": 2, "f16": 2, "s32": 4, "u32": 4,
    "f32": 4, "s64": 8, "u64": 8, "f64": 8,
}  # fmt: skip
_ARRAY = re.compile(r"\b(" + "|".join(_BYTES) + r")\[([\d,]*)\](\{[^}]*\})?")
# Instructions that move no bytes of their own.
_FREE = {
    "parameter", "get-tuple-element", "tuple", "bitcast", "constant", "after-all",
    "partition-id", "replica-id", "opt-barrier",
}  # fmt: skip
_SLICING = {"dynamic-slice", "slice", "gather"}


@dataclasses.dataclass
class _Instruction:
    name: str
    shape: str
    op: str
    args: str  # the text inside the opcode's parentheses: operands, a constant's value
    attrs: str

    @property
    def operands(self) -> list[str]:
        return re.findall(r"%([\w.-]+)", self.args)


@dataclasses.dataclass
class _Computation:
    instructions: dict[str, _Instruction]  # in program order
    root: str


def _leaves(shape: str) -> list[tuple[int, bool]]:
    """(bytes, in HBM) of each array in a shape (a tuple's in order)."""
    out = []
    for m in _ARRAY.finditer(shape):
        dims = [int(d) for d in m.group(2).split(",") if d]
        on_chip = re.search(r"S\((\d+)\)", m.group(3) or "")
        out.append((_BYTES[m.group(1)] * math.prod(dims), not on_chip or on_chip.group(1) == "0"))
    return out


def _hbm(shape: str) -> int:
    return sum(b for b, hbm in _leaves(shape) if hbm)


def _size(shape: str) -> int:
    return sum(b for b, _ in _leaves(shape))


def _balanced(text: str, start: int) -> int:
    """Index just past the bracket group opening at text[start]."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] in "({":
            depth += 1
        elif text[i] in ")}":
            depth -= 1
            if depth == 0:
                return i + 1
    raise ValueError(f"unbalanced HLO text near {text[start : start + 80]!r}")


def _parse(text: str) -> tuple[dict[str, _Computation], str]:
    computations: dict[str, _Computation] = {}
    entry, current = None, None
    for line in text.splitlines():
        header = re.match(r"^(ENTRY )?%(\S+) \(", line)
        if header:
            current = _Computation({}, "")
            computations[header.group(2)] = current
            entry = header.group(2) if header.group(1) else entry
            continue
        if line.startswith("}"):
            current = None
            continue
        body = re.match(r"^\s+(ROOT )?%(\S+) = ", line)
        if current is None or not body:
            continue
        rest = line[body.end() :]
        if rest.startswith("("):
            end = _balanced(rest, 0)
            shape, rest = rest[:end], rest[end + 1 :]
        else:
            shape, _, rest = rest.partition(" ")
        op = re.match(r"[\w-]+", rest).group(0)
        end = _balanced(rest, len(op))
        name = body.group(2)
        current.instructions[name] = _Instruction(
            name, shape, op, rest[len(op) + 1 : end - 1], rest[end:]
        )
        if body.group(1):
            current.root = name
    if entry is None:
        raise ValueError("no ENTRY computation in the HLO text")
    return computations, entry


def _called(attrs: str, key: str) -> list[str]:
    found = re.search(key + r"=\{?(%[\w.-]+(?:, %[\w.-]+)*)\}?", attrs)
    return [] if not found else [c.strip().lstrip("%") for c in found.group(1).split(",")]


def _attr(attrs: str, key: str) -> str:
    """The balanced {...} value of attribute `key`, or ''."""
    at = attrs.find(key + "={")
    return "" if at < 0 else attrs[at + len(key) + 1 : _balanced(attrs, at + len(key) + 1)]


_COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")


def _collectives(computations, comp: _Computation, shapes, seen: set) -> int:
    """HBM bytes of the collectives inside a fusion (and the fusions nested in it), each
    channel once: an asynchronous collective appears in every fusion it is split over."""
    total = 0
    for ins in comp.instructions.values():
        if ins.op == "fusion":
            (nested,) = _called(ins.attrs, "calls")
            inner = computations[nested]
            total += _collectives(
                computations, inner, {i.name: i.shape for i in inner.instructions.values()}, seen
            )
        elif ins.op in _COLLECTIVES:
            channel = re.search(r"channel_id=(\d+)", ins.attrs)
            key = channel.group(1) if channel else ins.name
            if key in seen:
                continue
            seen.add(key)
            total += sum(_hbm(shapes.get(o, "")) for o in ins.operands) + _hbm(ins.shape)
    return total


def _trip_count(condition: _Computation) -> int | None:
    """The constant a loop's counter is compared against (i < n), when there is one."""
    constants = {
        i.name: int(i.args)
        for i in condition.instructions.values()
        if i.op == "constant" and re.fullmatch(r"-?\d+", i.args.strip())
    }
    for i in condition.instructions.values():
        if i.op == "compare" and "direction=LT" in i.attrs:
            bounds = [constants[o] for o in i.operands if o in constants]
            if len(bounds) == 1:
                return bounds[0]
    return None


def _through_bitcasts(body: dict[str, _Instruction], name: str) -> str:
    while name in body and body[name].op == "bitcast":
        name = body[name].operands[0]
    return name


def _uses(computations, comp: _Computation, name: str) -> list[tuple[str, int]]:
    """How a fused computation uses one of its values: ('slice', bytes read) where it
    slices it, ('update', 0) where it is the target of an in-place update, ('whole', 0)
    elsewhere; seen through bitcasts and into nested fusions."""
    out = []
    for user in comp.instructions.values():
        for position, operand in enumerate(user.operands):
            if operand != name:
                continue
            if user.op == "bitcast":
                out += _uses(computations, comp, user.name)
            elif user.op == "fusion":
                (nested,) = _called(user.attrs, "calls")
                inner = computations[nested]
                param = next(
                    i.name
                    for i in inner.instructions.values()
                    if i.op == "parameter" and int(i.args) == position
                )
                out += _uses(computations, inner, param)
            elif user.op in _SLICING and position == 0:
                out.append(("slice", _size(user.shape)))
            elif user.op == "dynamic-update-slice" and position == 0:
                out.append(("update", 0))
            else:
                out.append(("whole", 0))
    return out


def _update_bytes(computations, comp: _Computation, name: str, params) -> int | None:
    """The bytes written when value `name` of a fused computation is an in-place update of
    one of its parameters (a dynamic-update-slice of it, possibly in a nested fusion);
    None when it is not."""
    ins = comp.instructions.get(_through_bitcasts(comp.instructions, name))
    if ins is None:
        return None
    if ins.op == "dynamic-update-slice":
        if _through_bitcasts(comp.instructions, ins.operands[0]) in params:
            return _size(comp.instructions[ins.operands[1]].shape)
        return None
    if ins.op == "fusion":
        (nested,) = _called(ins.attrs, "calls")
        inner = computations[nested]
        inner_params = {
            i.name: ins.operands[int(i.args)]
            for i in inner.instructions.values()
            if i.op == "parameter"
        }
        targets = {
            k for k, v in inner_params.items() if _through_bitcasts(comp.instructions, v) in params
        }
        return _update_bytes(computations, inner, inner.root, targets)
    return None


def _fusion_bytes(computations, fused: _Computation, ins: _Instruction, shapes) -> tuple[int, int]:
    """(read, written) HBM bytes of one fusion instruction, `fused` its computation."""
    body = fused.instructions
    params = {i.name: int(i.args) for i in body.values() if i.op == "parameter"}
    operands = ins.operands
    # An asynchronous collective's buffers pass through the fusions it is split over,
    # aliased from operand to output: the collective moves them (`_collectives`).
    aliased = re.findall(r"\{(\d*)\}: \((\d+), ", _attr(ins.attrs, "output_to_operand_aliasing"))
    aliased_outputs = {int(o) if o else 0 for o, _ in aliased}
    aliased_operands = {int(i) for _, i in aliased}
    read, updated = 0, set()
    for name, index in params.items():
        if index >= len(operands) or not _hbm(shapes.get(operands[index], "")):
            continue
        if index in aliased_operands:
            continue
        kinds = _uses(computations, fused, name)
        if kinds and all(kind in ("slice", "update") for kind, _ in kinds):
            read += sum(b for _, b in kinds)
            if any(kind == "update" for kind, _ in kinds):
                updated.add(name)
        else:
            read += _hbm(shapes[operands[index]])

    root = body[fused.root]
    outputs = root.operands if root.op == "tuple" else [root.name]
    written = 0
    for position, (out, (size, hbm)) in enumerate(zip(outputs, _leaves(ins.shape), strict=False)):
        if not hbm or position in aliased_outputs or _through_bitcasts(body, out) in params:
            continue  # on chip, or an operand passed through
        update = _update_bytes(computations, fused, out, updated)
        written += size if update is None else update
    return read, written


class _Counter:
    """Walks a parsed program: the bytes of a computation run `times` times, its loops
    multiplied out, recorded by opcode and instruction when `record`."""

    def __init__(self, computations: dict[str, _Computation]):
        self.computations = computations
        self.by_op: dict[str, float] = defaultdict(float)
        self.by_instruction: dict[str, float] = defaultdict(float)
        self.unknown: list[str] = []
        self._once: dict[str, float] = {}  # unrecorded walks run once, by computation

    def walk(self, name: str, times: int, record: bool = True) -> float:
        if record:
            return self._walk(name, times)
        if name not in self._once:  # each enclosing loop and branch asks again
            self._once[name] = self._walk(name, 1, record=False)
        return self._once[name] * times

    def _walk(self, name: str, times: int, record: bool = True) -> float:
        computations = self.computations
        instructions = computations[name].instructions
        shapes = {i.name: i.shape for i in instructions.values()}
        total, channels = 0.0, set()
        for ins in instructions.values():
            if ins.op in _FREE or ins.op.endswith("-done"):
                continue
            if ins.op == "while":
                (body,) = _called(ins.attrs, "body")
                (condition,) = _called(ins.attrs, "condition")
                trips = _trip_count(computations[condition])
                if trips is None and record:
                    self.unknown.append(ins.name)
                total += self.walk(body, times * (trips or 1), record)
                continue
            if ins.op == "conditional":
                branches = _branches(ins)
                costs = [self.walk(b, 1, record=False) for b in branches]
                total += self.walk(branches[costs.index(max(costs))], times, record)
                continue
            if ins.op == "call":
                total += sum(self.walk(c, times, record) for c in _called(ins.attrs, "to_apply"))
                continue
            if ins.op == "custom-call" and "AllocateBuffer" in ins.attrs:
                continue
            if ins.op == "fusion":
                (fused,) = _called(ins.attrs, "calls")
                read, written = _fusion_bytes(computations, computations[fused], ins, shapes)
                inner = computations[fused]
                inner_shapes = {i.name: i.shape for i in inner.instructions.values()}
                written += _collectives(computations, inner, inner_shapes, channels)
            elif ins.op.endswith("-start"):
                # copy-start: (destination, source, context); the others: ((source),
                # destination, ...). Read the source, write the destination.
                leaves = _leaves(ins.shape)
                moved, to_hbm = leaves[0 if ins.op == "copy-start" else 1]
                read = moved if any(_hbm(shapes.get(o, "")) for o in ins.operands) else 0
                written = moved if to_hbm else 0
            elif ins.op == "dynamic-update-slice":
                update = _size(shapes.get(ins.operands[1], ""))
                read, written = update, update if _hbm(ins.shape) else 0
            elif ins.op in _SLICING:
                from_hbm = _hbm(shapes.get(ins.operands[0], ""))
                read, written = (_size(ins.shape) if from_hbm else 0), _hbm(ins.shape)
            else:
                read = sum(_hbm(shapes.get(o, "")) for o in ins.operands)
                written = _hbm(ins.shape)
            if record:
                self.by_op[ins.op] += (read + written) * times
                self.by_instruction[f"{name}/{ins.name}"] += (read + written) * times
            total += (read + written) * times
        return total


def _branches(ins: _Instruction) -> list[str]:
    return _called(ins.attrs, "branch_computations") or (
        _called(ins.attrs, "true_computation") + _called(ins.attrs, "false_computation")
    )


def hbm_bytes(hlo_text: str, top: int = 12) -> dict:
    """{'total': bytes the program moves to and from HBM, 'by_op': {opcode: bytes},
    'largest': the `top` instructions that move most ({computation/instruction: bytes}),
    'unknown_trip_counts': loops counted once}, from `compiled.as_text()`."""
    computations, entry = _parse(hlo_text)
    counter = _Counter(computations)
    total = counter.walk(entry, 1)
    largest = sorted(counter.by_instruction.items(), key=lambda kv: -kv[1])[:top]
    return {
        "total": total,
        "by_op": dict(counter.by_op),
        "largest": dict(largest),
        "unknown_trip_counts": counter.unknown,
    }


def loops(hlo_text: str) -> list[dict]:
    """Every while loop of the program, outermost first: {'name', 'trips' (its bound, None
    when it has none), 'bytes_per_trip' (its body once, inner loops multiplied out),
    'inner': the loops its body runs (through calls and conditionals), the same dicts}.
    A program that loops over chunks of a few steps, as the engine's generation does,
    gives its chunk's bytes as its loop's `bytes_per_trip`."""
    computations, entry = _parse(hlo_text)
    counter = _Counter(computations)

    def found(name: str) -> list[dict]:
        out = []
        for ins in computations[name].instructions.values():
            if ins.op == "while":
                (body,) = _called(ins.attrs, "body")
                (condition,) = _called(ins.attrs, "condition")
                out.append({
                    "name": ins.name,
                    "trips": _trip_count(computations[condition]),
                    "bytes_per_trip": counter.walk(body, 1, record=False),
                    "inner": found(body),
                })  # fmt: skip
            elif ins.op in ("call", "conditional"):
                called = _called(ins.attrs, "to_apply") if ins.op == "call" else _branches(ins)
                out += [loop for c in called for loop in found(c)]
        return out

    return found(entry)
