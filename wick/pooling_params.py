"""Per-request settings of an embedding request, with vLLM's names."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PoolingParams:
    """`dimensions`: keep the first this many dimensions of the embedding (Matryoshka models only), which is
    then normalised again when the model normalises. `normalize`: None follows the model (its sentence-transformers
    Normalize module); True or False overrides it."""

    dimensions: int | None = None
    normalize: bool | None = None

    def __post_init__(self) -> None:
        if self.dimensions is not None and (isinstance(self.dimensions, bool) or not isinstance(self.dimensions, int)
                                            or self.dimensions < 1):
            raise ValueError(f"dimensions must be a positive integer, got {self.dimensions!r}")
