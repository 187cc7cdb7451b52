"""Check, before re-wrapping, that every rank holds the same model structure.

DDP's own check covers only the trainable shapes and fails deep inside its constructor; a
rank that grew differently must instead get an error that names the layers that differ.
The check is one small all-gather; on a mismatch every rank sees it and raises.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..errors import RankMismatchError
from ..nn.layers import dendritic_layers, unwrap_model
from .collectives import _reduce_device, is_distributed, world_size


def structure_fingerprint(model: nn.Module) -> dict[str, Any]:
    """JSON-able summary of the structure: dendrites per layer, every parameter's shape/flag."""
    inner = unwrap_model(model)
    return {
        "dendrites": {path: layer.num_dendrites
                      for path, layer in sorted(dendritic_layers(inner).items())},
        "params": [[name, list(getattr(p, "ds_shape", p.shape)), bool(p.requires_grad)]
                   for name, p in inner.named_parameters()],
        "fed_neurons": {path: layer.set_neurons()
                        for path, layer in sorted(dendritic_layers(inner).items())
                        if layer.dendrite_mask is not None},
    }


def _summary(fp: dict[str, Any]) -> dict[str, Any]:
    trainable = [p for p in fp["params"] if p[2]]
    return {"dendrites": fp["dendrites"], "tensors": len(fp["params"]),
            "trainable_tensors": len(trainable),
            "trainable_values": sum(_numel(p[1]) for p in trainable),
            "params": fp["params"], "fed_neurons": fp.get("fed_neurons", {})}


def _numel(shape: list[int]) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _all_gather_json(obj: Any) -> list[Any]:
    """Every rank's JSON-able object (no pickle): lengths first, then padded bytes."""
    device = _reduce_device()
    data = torch.tensor(list(json.dumps(obj, sort_keys=True).encode()), dtype=torch.uint8)
    length = torch.tensor([data.numel()], dtype=torch.int64, device=device)
    lengths = [torch.zeros_like(length) for _ in range(world_size())]
    dist.all_gather(lengths, length)
    longest = int(max(t.item() for t in lengths))
    padded = torch.zeros(longest, dtype=torch.uint8)
    padded[:data.numel()] = data
    padded = padded.to(device)
    chunks = [torch.zeros_like(padded) for _ in range(world_size())]
    dist.all_gather(chunks, padded)
    return [json.loads(bytes(c[:int(n.item())].cpu().tolist()).decode())
            for c, n in zip(chunks, lengths)]


def _first_difference(a: dict[str, Any], b: dict[str, Any], rank_b: int) -> str:
    for path in sorted(set(a["dendrites"]) | set(b["dendrites"])):
        ka, kb = a["dendrites"].get(path), b["dendrites"].get(path)
        if ka != kb:
            return (f"layer {path!r} has {ka} dendrite(s) on rank 0 and {kb} on rank "
                    f"{rank_b}")
    pa = {p[0]: p for p in a["params"]}
    pb = {p[0]: p for p in b["params"]}
    for name in list(pa) + [n for n in pb if n not in pa]:
        if pa.get(name) != pb.get(name):
            def show(p):
                return "absent" if p is None else \
                    f"shape {tuple(p[1])}, requires_grad={p[2]}"
            return (f"parameter {name!r}: {show(pa.get(name))} on rank 0, "
                    f"{show(pb.get(name))} on rank {rank_b}")
    fa, fb = a.get("fed_neurons", {}), b.get("fed_neurons", {})
    for path in sorted(set(fa) | set(fb)):
        if fa.get(path) != fb.get(path):
            return (f"layer {path!r} feeds other neurons from its dendrite sets on rank 0 "
                    f"than on rank {rank_b} (the growth statistics were not all-reduced)")
    return "the structures differ"


def check_same_structure(model: nn.Module, when: str = "before re-wrapping the model") -> None:
    """Raise RankMismatchError on every rank if the ranks' structures differ (no hang)."""
    if not is_distributed():
        return
    fp = structure_fingerprint(model)
    text = json.dumps(fp, sort_keys=True)
    summary = _summary(fp)
    local = torch.tensor([zlib.crc32(text.encode()), summary["tensors"],
                          summary["trainable_values"]], dtype=torch.int64,
                         device=_reduce_device())
    gathered = [torch.zeros_like(local) for _ in range(world_size())]
    dist.all_gather(gathered, local)
    if all(torch.equal(g, gathered[0]) for g in gathered):
        return
    summaries = _all_gather_json(summary)
    per_rank = "; ".join(
        f"rank {r}: dendrites {s['dendrites']}, {s['trainable_tensors']} trainable tensors "
        f"({s['trainable_values']} values) of {s['tensors']}"
        for r, s in enumerate(summaries))
    differing = next(r for r, s in enumerate(summaries) if s != summaries[0])
    raise RankMismatchError(
        f"the ranks disagree on the model structure {when}: "
        f"{_first_difference(summaries[0], summaries[differing], differing)} ({per_rank}). "
        "Every rank must build the same model, perforate it with the same selection, and "
        "call controller.step() / add_dendrites() / load() at the same epoch with the same "
        "settings; never grow or freeze layers on one rank only")
