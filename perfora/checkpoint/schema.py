"""Checks of a checkpoint file's headers before anything is allocated or changed.

A checkpoint is read in two steps: the safetensors header (tensor names, dtypes, shapes and
byte ranges) and the JSON state perfora keeps in its metadata are parsed with limits on size
and nesting, then checked against the schema below: types, ranges, and agreement between
the structure and the tensors the file holds. The parts that belong to the floors above are
checked next to what they describe (the controller's state in :mod:`perfora.growth.state`, a
rule's in its class) through the ``check_state`` of :func:`validate_meta`. Every failure is
a :class:`CheckpointError` that names the field, e.g. ``structure['fc1'].num_dendrites:
expected an int in 0..4096, got -1``. Only then are tensors read.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import CheckpointError

MAX_HEADER_BYTES = 64 * 1024 * 1024
"""Largest header (safetensors JSON, which holds perfora's JSON state) a load accepts."""
MAX_JSON_DEPTH = 64
"""Deepest nesting of JSON arrays and objects a load accepts (perfora writes at most ~6)."""
MAX_DENDRITES = 4096
"""Most dendrite sets one layer of a checkpoint may claim."""
MAX_NEURONS = 2**31 - 1
MAX_COUNT = 10**12
"""Upper bound of counters such as epochs."""
MAX_DIMS = 32

_KINDS = ("linear", "conv", "generic")

# safetensors dtype names -> torch dtypes (those this torch build has)
_DTYPE_NAMES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8",
    "U64": "uint64", "U32": "uint32", "U16": "uint16", "U8": "uint8", "BOOL": "bool",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "C64": "complex64",
}
DTYPES: dict[str, torch.dtype] = {name: getattr(torch, attr) for name, attr in
                                  _DTYPE_NAMES.items() if hasattr(torch, attr)}


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a safetensors header, checked: dtype, shape and its byte range."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    begin: int
    end: int


# ------------------------------------------------------------------ messages

def _show(value: Any) -> str:
    """A short description of a bad value for messages (never the whole of a big one)."""
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, int | float):
        text = repr(value)
        return text if len(text) <= 40 else f"an int of {len(str(abs(value)))} digits"
    if isinstance(value, str):
        return repr(value) if len(value) <= 40 else f"a str of {len(value)} characters"
    if isinstance(value, list):
        return f"a list of {len(value)}"
    if isinstance(value, dict):
        return f"an object with {len(value)} key(s)"
    return type(value).__name__


def fail(where: str, expected: str, got: Any) -> CheckpointError:
    """The error for field ``where``: what it should be and what the file has."""
    return CheckpointError(f"{where}: expected {expected}, got {_show(got)}")


# ------------------------------------------------------------------ parsing

def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def json_depth(value: Any, limit: int) -> int:
    """Nesting depth of parsed JSON (iterative; stops counting past ``limit``)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            if deepest > limit:
                return deepest
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children
                         if isinstance(child, dict | list))
    return deepest


def parse_json(raw: bytes | str, where: str, *, max_bytes: int | None = None,
               max_depth: int | None = None) -> Any:
    """JSON with a size cap, a nesting cap and no duplicate keys; CheckpointError otherwise.

    The caps default to :data:`MAX_HEADER_BYTES` and :data:`MAX_JSON_DEPTH`."""
    max_bytes = MAX_HEADER_BYTES if max_bytes is None else max_bytes
    max_depth = MAX_JSON_DEPTH if max_depth is None else max_depth
    size = len(raw)
    if size > max_bytes:
        raise CheckpointError(f"{where} is {size} bytes, more than the {max_bytes} a "
                              "checkpoint header may have")
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        value = json.loads(text, object_pairs_hook=_no_duplicates)
    except RecursionError:
        raise CheckpointError(f"{where} is nested too deeply (more than {max_depth} "
                              "levels)") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{where} is not valid JSON: {str(exc)[:200]}") from None
    if json_depth(value, max_depth) > max_depth:
        raise CheckpointError(f"{where} is nested too deeply (more than {max_depth} levels)")
    return value


# ------------------------------------------------------------------ field checks

def check_dict(value: Any, where: str) -> dict[str, Any]:
    """A JSON object (keys are always strings)."""
    if not isinstance(value, dict):
        raise fail(where, "an object", value)
    return value


def check_list(value: Any, where: str) -> list[Any]:
    """A JSON array."""
    if not isinstance(value, list):
        raise fail(where, "a list", value)
    return value


def check_int(value: Any, where: str, low: int = 0, high: int = MAX_COUNT) -> int:
    """An int (not a bool) in ``low..high``."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise fail(where, f"an int in {low}..{high}", value)
    return value


def check_number(value: Any, where: str, *, finite: bool = True,
                 optional: bool = False) -> float | None:
    """A number (int or float, not a bool); finite unless ``finite=False``; None if optional."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise fail(where, "a number" + (" or null" if optional else ""), value)
    if isinstance(value, int) and abs(value) > 2**63:
        raise fail(where, "a number of at most 64 bits", value)
    if finite and not math.isfinite(value):
        raise fail(where, "a finite number", value)
    return value


def check_bool(value: Any, where: str) -> bool:
    """true or false."""
    if not isinstance(value, bool):
        raise fail(where, "true or false", value)
    return value


def check_str(value: Any, where: str, *, max_len: int = 4096, optional: bool = False,
              choices: tuple[str, ...] | None = None) -> str | None:
    """A string (of at most ``max_len`` characters, one of ``choices`` when given)."""
    if value is None and optional:
        return None
    if not isinstance(value, str) or len(value) > max_len:
        raise fail(where, "a string" + (" or null" if optional else ""), value)
    if choices is not None and value not in choices:
        raise fail(where, f"one of {list(choices)}", value)
    return value


def check_optional(data: Mapping[str, Any], key: str, where: str, check: Callable[..., Any],
                   *args: Any, **kwargs: Any) -> None:
    """``check(data[key], "<where>.<key>", ...)`` when ``data`` has ``key``."""
    if key in data:
        check(data[key], f"{where}.{key}" if where else key, *args, **kwargs)


# ------------------------------------------------------------------ safetensors header

def check_safetensors_header(header: Any, data_len: int, where: str
                             ) -> tuple[list[TensorEntry], dict[str, str]]:
    """Tensor entries and metadata of a parsed safetensors header, checked against the data.

    Every dtype must be known, every shape a list of sizes, and the byte ranges must tile the
    ``data_len`` bytes after the header exactly (as safetensors writes them)."""
    header = check_dict(header, where)
    metadata = header.get("__metadata__", {})
    if metadata is None:
        metadata = {}
    check_dict(metadata, f"{where}['__metadata__']")
    for key, value in metadata.items():
        check_str(value, f"{where}['__metadata__'][{key!r}]", max_len=MAX_HEADER_BYTES)
    entries = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        at = f"{where}[{name!r}]"
        info = check_dict(info, at)
        dtype_name = check_str(info.get("dtype"), f"{at}.dtype", choices=tuple(DTYPES))
        shape = check_list(info.get("shape"), f"{at}.shape")
        if len(shape) > MAX_DIMS:
            raise fail(f"{at}.shape", f"at most {MAX_DIMS} dimensions", shape)
        for i, size in enumerate(shape):
            check_int(size, f"{at}.shape[{i}]", 0, 2**62)
        offsets = check_list(info.get("data_offsets"), f"{at}.data_offsets")
        if len(offsets) != 2:
            raise fail(f"{at}.data_offsets", "[begin, end]", offsets)
        begin = check_int(offsets[0], f"{at}.data_offsets[0]", 0, data_len)
        end = check_int(offsets[1], f"{at}.data_offsets[1]", begin, data_len)
        dtype = DTYPES[dtype_name]  # type: ignore[index]
        numel = math.prod(shape)
        itemsize = torch.empty((), dtype=dtype).element_size()
        if numel * itemsize != end - begin:
            raise CheckpointError(
                f"{at}: shape {shape} of {dtype_name} is {numel * itemsize} bytes but its "
                f"data_offsets span {end - begin}")
        entries.append(TensorEntry(name, dtype, tuple(shape), begin, end))
    position = 0
    for entry in sorted(entries, key=lambda e: (e.begin, e.end)):
        if entry.begin != position:
            raise CheckpointError(f"{where}[{entry.name!r}].data_offsets: tensor data "
                                  f"{'overlaps' if entry.begin < position else 'leaves a gap'}"
                                  f" at byte {min(position, entry.begin)}")
        position = entry.end
    if position != data_len:
        raise CheckpointError(f"{where}: the tensors take {position} bytes but the file holds "
                              f"{data_len} after the header (truncated or padded)")
    return entries, metadata


# ------------------------------------------------------------------ perfora's state

Shapes = Mapping[str, Mapping[str, tuple[int, ...]]]
"""Tensor shapes of a checkpoint by group ('model', 'best', 'optimizer') and key."""


def validate_structure(specs: Any, where: str = "structure") -> dict[str, Any]:
    """A structure as :func:`perfora.nn.perforation.layer_specs` writes it, every field checked."""
    from ..nn.layers import _ACTIVATIONS

    specs = check_dict(specs, where)
    for path, spec in specs.items():
        at = f"{where}[{path!r}]"
        spec = check_dict(spec, at)
        for key in ("num_dendrites", "num_neurons", "neuron_axis", "activation"):
            if key not in spec:
                raise CheckpointError(f"{at}.{key}: missing")
        k = check_int(spec["num_dendrites"], f"{at}.num_dendrites", 0, MAX_DENDRITES)
        n = check_int(spec["num_neurons"], f"{at}.num_neurons", 1, MAX_NEURONS)
        check_int(spec["neuron_axis"], f"{at}.neuron_axis", -MAX_DIMS, MAX_DIMS - 1)
        check_str(spec["activation"], f"{at}.activation", choices=tuple(sorted(_ACTIVATIONS)))
        check_optional(spec, "grouped", at, check_bool)
        check_optional(spec, "kind", at, check_str, choices=_KINDS)
        check_optional(spec, "base_type", at, check_str, max_len=256)
        check_optional(spec, "grouped_with", at, check_str, optional=True)
        neurons = spec.get("neurons")
        if neurons is None:
            continue
        check_list(neurons, f"{at}.neurons")
        if len(neurons) != k:
            raise fail(f"{at}.neurons", f"one entry per dendrite set ({k})", neurons)
        for row, chosen in enumerate(neurons):
            if chosen is None:
                continue
            check_list(chosen, f"{at}.neurons[{row}]")
            if not 1 <= len(chosen) <= n:
                raise fail(f"{at}.neurons[{row}]", f"1..{n} neuron indices", chosen)
            for i, index in enumerate(chosen):
                check_int(index, f"{at}.neurons[{row}][{i}]", 0, n - 1)
            if len(set(chosen)) != len(chosen):
                raise fail(f"{at}.neurons[{row}]", "distinct neuron indices", chosen)
    return specs


def _set_sizes(spec: Mapping[str, Any]) -> list[int]:
    k, n = spec["num_dendrites"], spec["num_neurons"]
    neurons = spec.get("neurons")
    if neurons is None:
        return [n] * k
    return [n if chosen is None else len(chosen) for chosen in neurons]


def check_structure_tensors(specs: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]],
                            where: str, group: str) -> None:
    """The dendrite tensors of tensor group ``group`` agree with the (checked) structure."""
    for path, spec in specs.items():
        at = f"{where}[{path!r}].num_dendrites"
        prefix = f"{path}." if path else ""
        k, n = spec["num_dendrites"], spec["num_neurons"]
        out = shapes.get(prefix + "out_weight")
        if k == 0:
            if out is not None:
                raise CheckpointError(f"{at}: the structure says 0 dendrite sets but tensor "
                                      f"{group}/{prefix}out_weight has shape {list(out)}")
            continue
        if out != (k, n):
            raise CheckpointError(
                f"{at}: the structure says {k} dendrite set(s) of {n} neurons, so tensor "
                f"{group}/{prefix}out_weight should have shape {[k, n]}, but it "
                f"{'is missing' if out is None else f'has shape {list(out)}'}")
        pairs = k * (k - 1) // 2
        cascade = shapes.get(prefix + "cascade")
        if (cascade is None) != (pairs == 0) or (pairs and cascade != (pairs, n)):
            raise CheckpointError(
                f"{at}: {k} dendrite set(s) need tensor {group}/{prefix}cascade of shape "
                f"{[pairs, n] if pairs else 'none'}, got "
                f"{'none' if cascade is None else list(cascade)}")
        mask = shapes.get(prefix + "dendrite_mask")
        partial = spec.get("neurons") is not None and any(
            chosen is not None for chosen in spec["neurons"])
        if partial and mask != (k, n):
            raise CheckpointError(f"{where}[{path!r}].neurons: partial dendrite sets need "
                                  f"tensor {group}/{prefix}dendrite_mask of shape {[k, n]}, "
                                  f"got {'none' if mask is None else list(mask)}")
        rows = sum(_set_sizes(spec))
        for name in ("bank_weight", "bank_bias"):
            bank = shapes.get(prefix + name)
            if bank is not None and (not bank or bank[0] != rows):
                raise CheckpointError(f"{at}: {k} dendrite set(s) feeding {rows} neuron(s) "
                                      f"need {rows} rows in tensor {group}/{prefix}{name}, "
                                      f"got shape {list(bank)}")


def validate_optimizer_meta(data: Any, tensor_keys: list[str],
                            where: str = "optimizer") -> dict[str, Any]:
    """The JSON half of a saved optimizer state, and the names of its tensors."""
    data = check_dict(data, where)
    for key in ("state", "param_groups"):
        if key not in data:
            raise CheckpointError(f"{where}.{key}: missing")
    indices: set[int] = set()
    for i, group in enumerate(check_list(data["param_groups"], f"{where}.param_groups")):
        at = f"{where}.param_groups[{i}]"
        group = check_dict(group, at)
        if "params" not in group:
            raise CheckpointError(f"{at}.params: missing")
        for j, index in enumerate(check_list(group["params"], f"{at}.params")):
            check_int(index, f"{at}.params[{j}]", 0, 2**31)
            if index in indices:
                raise fail(f"{at}.params[{j}]", "a parameter index listed once", index)
            indices.add(index)
    for idx, entry in check_dict(data["state"], f"{where}.state").items():
        at = f"{where}.state[{idx!r}]"
        if not idx.isdigit() or int(idx) not in indices:
            raise fail(f"{where}.state", "keys that are parameter indices", idx)
        for key, value in check_dict(entry, at).items():
            if isinstance(value, dict | list):
                raise fail(f"{at}[{key!r}]", "a number, string or null", value)
    for key in tensor_keys:
        idx, dot, name = key.partition(".")
        if not dot or not name or not idx.isdigit() or int(idx) not in indices:
            raise fail(f"tensor optimizer/{key}", "a name '<parameter index>.<state>'", key)
    if data.get("param_names") is not None:
        for i, name in enumerate(check_list(data["param_names"], f"{where}.param_names")):
            check_str(name, f"{where}.param_names[{i}]", optional=True)
    return data


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "list"
    if isinstance(value, dict):
        return "object"
    return "tensor" if isinstance(value, torch.Tensor) else type(value).__name__


def check_like(saved: Any, current: Any, where: str, strict_keys: bool = True) -> None:
    """``saved`` has the keys and kinds of values of ``current`` (a fresh object's state).

    For states that are restored with ``__dict__.update`` (schedulers) or copied as they are
    (optimizer param groups): a value of another kind (a string where a number belongs) is
    refused, and with ``strict_keys`` a key the fresh object lacks. Null matches anything."""
    if saved is None or current is None:
        return
    if isinstance(current, Mapping):
        saved = check_dict(saved, where)
        as_text = {str(k): k for k in current}  # JSON wrote int keys as text
        for key, value in saved.items():
            if key in current or str(key) in as_text:
                check_like(value, current[key if key in current else as_text[str(key)]],
                           f"{where}.{key}")
            elif strict_keys:
                raise fail(where, f"only the keys {sorted(map(str, current))[:12]}", key)
        return
    want, got = _kind(current), _kind(saved)
    if want == "tensor" and got == "number":
        return
    if want != got:
        raise fail(where, f"a {want}", saved)
    if got == "number" and not math.isfinite(saved) and saved != current:
        raise fail(where, "a finite number", saved)  # (ReduceLROnPlateau keeps an infinity)
    if got == "list" and len(current) and len(saved) != len(current):
        raise fail(where, f"a list of {len(current)}", saved)
    if got == "list":
        for i, (a, b) in enumerate(zip(saved, current, strict=False)):
            check_like(a, b, f"{where}[{i}]")


def with_keys_of(saved: Any, current: Any) -> Any:
    """``saved`` (a state read from JSON) with the keys and mapping types of ``current`` (a
    fresh object's state): JSON turns int keys into text (``MultiStepLR``'s milestones, a
    ``Counter``), and a scheduler loaded with text keys would never match its epoch."""
    if not (isinstance(saved, Mapping) and isinstance(current, Mapping)):
        return saved
    as_text = {str(k): k for k in current}
    items = {}
    for key, value in saved.items():
        own = key if key in current else as_text.get(str(key), key)
        items[own] = with_keys_of(value, current.get(own))
    if type(current) is dict:
        return items
    out = copy.copy(current)
    out.clear()
    out.update(items)
    return out


StateCheck = Callable[[Mapping[str, Any], Mapping[str, Any] | None], None]
"""Checks the parts of perfora's JSON state that belong to the floors above (the controller's
and the rule's state): ``check(meta, structure)``, CheckpointError naming the field."""


def validate_meta(meta: Any, shapes: Shapes, check_state: StateCheck | None = None
                  ) -> dict[str, Any]:
    """Every part of perfora's JSON state that is present, and its agreement with the tensors.

    The structure, best structure, optimizer and scheduler are checked here; the controller's
    and the rule's state by ``check_state`` (the growth controller's reader passes its own,
    see :func:`perfora.growth.saved_run.check_run_state`), in the order the fields were
    always checked. Unknown top-level keys are kept (``save_model(path, model, note=...)``
    adds some)."""
    meta = check_dict(meta, "perfora metadata")
    check_str(meta.get("format"), "format")
    check_int(meta.get("format_version"), "format_version", 1, 2**31)
    check_optional(meta, "perfora_version", "", check_str, max_len=64)
    structure = None
    if "structure" in meta:
        structure = validate_structure(meta["structure"], "structure")
        if "model" in shapes:
            check_structure_tensors(structure, shapes["model"], "structure", "model")
    best_structure = meta.get("best_structure")
    if best_structure is not None:
        validate_structure(best_structure, "best_structure")
        if "best" in shapes:
            check_structure_tensors(best_structure, shapes["best"], "best_structure", "best")
    if "best" in shapes and best_structure is None:
        raise CheckpointError("best_structure: missing, but the file holds best-model tensors")
    if check_state is not None:
        check_state(meta, structure)
    if "config" in meta:
        check_dict(meta["config"], "config")
    if "optimizer" in meta:
        validate_optimizer_meta(meta["optimizer"], list(shapes.get("optimizer", {})))
    elif "optimizer" in shapes:
        raise CheckpointError("optimizer: missing, but the file holds optimizer tensors")
    check_optional(meta, "optimizer_class", "", check_str, max_len=256)
    if meta.get("scheduler") is not None:
        check_dict(meta["scheduler"], "scheduler")
    return meta
