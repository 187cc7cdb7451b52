"""Tied weights: modules whose parameter is the same Parameter as another module's.

A language model's output layer often shares its weight with the input embedding
(``lm_head.weight is embed_tokens.weight``). ``perforate`` leaves such a layer alone by
default: its weight is also the embedding's, so growing it changes what the embedding
learns too, and a naive wrap would break Hugging Face's saving of shared tensors. Named in
``paths=`` it is grown with the tie kept: the wrapped layer's ``base.weight`` stays the very
Parameter of the embedding, and the model's ``_tied_weights_keys`` are renamed to the
wrapped path so that ``save_pretrained`` (and every Trainer checkpoint) stores it once.
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import nn


def tied_modules(root: nn.Module) -> dict[int, list[tuple[str, str]]]:
    """``id(module)`` -> [(its parameter name, the other module's parameter path), ...].

    A module is tied when one of its parameters is also reachable through a module that is
    not itself (the same module under two paths is an alias, not a tie)."""
    owners: dict[int, list[tuple[str, nn.Module, str]]] = {}
    for mod_path, module in root.named_modules(remove_duplicate=False):
        for name, param in module.named_parameters(recurse=False):
            full = f"{mod_path}.{name}" if mod_path else name
            owners.setdefault(id(param), []).append((full, module, name))
    tied: dict[int, list[tuple[str, str]]] = {}
    for entries in owners.values():
        if len({id(m) for _, m, _ in entries}) < 2:
            continue
        for _full, module, name in entries:
            others = [f for f, m, _ in entries if m is not module]
            pairs = tied.setdefault(id(module), [])
            if (name, others[0]) not in pairs:
                pairs.append((name, others[0]))
    return tied


def tie_reason(path: str, ties: list[tuple[str, str]]) -> str:
    """The report line for a tied layer left alone by default."""
    shared = ", ".join(f"{path}.{name} is {other}" for name, other in ties)
    return (f"its weight is tied ({shared}); growing it also trains the tied parameter "
            f"through it. Name it in paths=[{path!r}] to grow it anyway (the tie is kept)")


def rename_tied_keys(root: nn.Module, path: str, new_path: str) -> None:
    """Point the ``_tied_weights_keys`` that name ``path.*`` at ``new_path.*`` instead.

    Hugging Face models declare which saved keys are duplicates of another
    (``{"lm_head.weight": "model.embed_tokens.weight"}``, or a list of names in older
    versions); ``save_pretrained`` refuses shared tensors it does not find there. The
    renamed copy is set on each declaring instance, so the class and other models keep
    theirs."""
    for mod_path, module in root.named_modules():
        keys = getattr(module, "_tied_weights_keys", None)
        rel_old = _relative(path, mod_path)
        if not keys or rel_old is None:
            continue
        rel_new = _relative(new_path, mod_path)
        module._tied_weights_keys = _renamed(keys, rel_old, rel_new)
        expanded = module.__dict__.get("all_tied_weights_keys")
        if isinstance(expanded, Mapping):
            module.all_tied_weights_keys = _renamed(expanded, rel_old, rel_new)


def _relative(path: str, prefix: str) -> str | None:
    if not prefix:
        return path
    return path[len(prefix) + 1:] if path.startswith(prefix + ".") else None


def _renamed(keys, old: str, new: str):
    def one(key: str) -> str:
        return new + key[len(old):] if key.startswith(old + ".") else key

    if isinstance(keys, Mapping):
        return {one(k): v for k, v in keys.items()}
    return [one(k) for k in keys]
