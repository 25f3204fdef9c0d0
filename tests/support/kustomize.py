"""Render a kustomization as ``kubectl apply -k`` would, for the subset docker/kubernetes uses:
``resources`` (files of one or more documents, or directories with a kustomization of their own)
and ``patches`` given by ``path`` (strategic merge patches). Anything else in a kustomization is
refused, so a new feature there cannot pass unrendered.

A strategic merge here: mappings merge key by key, a null removes the key, a list of mappings that
all have a ``name`` merges item by item by that name, and any other list is replaced whole (what
Kubernetes' patch strategies do for the fields these manifests patch)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

KNOWN_FIELDS = {"apiVersion", "kind", "resources", "patches"}


def key(doc: dict) -> tuple[str, str]:
    """(kind, name): how a patch finds the resource it applies to."""
    return doc["kind"], doc["metadata"]["name"]


def load_documents(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def render(directory: Path) -> list[dict]:
    """The resources of the kustomization in ``directory``, patched, in the order listed."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(kustomization) - KNOWN_FIELDS
    if unknown:
        raise ValueError(f"{directory}: kustomization fields this renderer does not know: {unknown}")
    docs: list[dict] = []
    for entry in kustomization.get("resources", []):
        path = (directory / entry).resolve()
        docs.extend(render(path) if path.is_dir() else load_documents(path))
    by_key = {key(doc): doc for doc in docs}
    if len(by_key) != len(docs):
        raise ValueError(f"{directory}: two resources of the same kind and name")
    for patch_entry in kustomization.get("patches", []):
        if set(patch_entry) != {"path"}:
            raise ValueError(f"{directory}: only patches given by path are rendered: {patch_entry}")
        for patch in load_documents(directory / patch_entry["path"]):
            target = by_key.get(key(patch))
            if target is None:
                raise ValueError(f"{directory}: patch {patch_entry['path']} matches no resource {key(patch)}")
            merged = merge(target, patch)
            target.clear()
            target.update(merged)
    return docs


def merge(base: Any, patch: Any) -> Any:
    """``patch`` applied to ``base`` as a strategic merge patch (the subset above)."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = copy.deepcopy(base)
        for k, v in patch.items():
            if v is None:
                out.pop(k, None)
            elif k in out:
                out[k] = merge(out[k], v)
            else:
                out[k] = copy.deepcopy(v)
        return out
    if isinstance(base, list) and isinstance(patch, list) and _named(base) and _named(patch):
        out = copy.deepcopy(base)
        index = {item["name"]: i for i, item in enumerate(out)}
        for item in patch:
            if item["name"] in index:
                out[index[item["name"]]] = merge(out[index[item["name"]]], item)
            else:
                out.append(copy.deepcopy(item))
        return out
    return copy.deepcopy(patch)


def _named(items: list) -> bool:
    return bool(items) and all(isinstance(i, dict) and "name" in i for i in items)
