"""The quantized models are driven by the models' test helper (tests/models/paged_generate.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "models"))
