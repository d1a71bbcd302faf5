# SPDX-License-Identifier: Apache-2.0
"""evidence/repro_topk_order.py's comparison of two top-k selections (CPU)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import repro_topk_order  # noqa: E402


def test_compare_tells_order_from_set() -> None:
    """A row permuted counts as an order difference only; a row with another member counts
    as both; equal rows count as neither."""
    a = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9]], dtype=torch.int32)
    b = torch.tensor([[1, 2, 3], [6, 5, 4], [7, 8, 10]], dtype=torch.int32)
    assert repro_topk_order.compare(a, b) == {"rows_order_differs": 2, "rows_set_differs": 1}
    assert repro_topk_order.compare(a, a.clone()) == {
        "rows_order_differs": 0,
        "rows_set_differs": 0,
    }
