"""Reading a safetensors checkpoint folder: one model.safetensors, or shards listed in
model.safetensors.index.json."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


def safetensors_files(folder: str) -> list[str]:
    """The checkpoint's files: the shards named by the index, else model.safetensors, else every *.safetensors."""
    root = Path(folder)
    index = root / INDEX_FILE
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        return [str(root / shard) for shard in sorted(set(weight_map.values()))]
    if (root / SINGLE_FILE).is_file():
        return [str(root / SINGLE_FILE)]
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {folder}")
    return [str(file) for file in files]


def count_safetensors_tensors(folder: str) -> int:
    """How many tensors `iter_safetensors_weights(folder)` yields (reads only the file headers)."""
    total = 0
    for file in safetensors_files(folder):
        with safe_open(file, framework="pt") as f:
            total += len(f.keys())
    return total


def iter_safetensors_weights(folder: str) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for every tensor of the checkpoint, each shard memory-mapped once, one tensor at a time."""
    for file in safetensors_files(folder):
        with safe_open(file, framework="pt", device="cpu") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)
