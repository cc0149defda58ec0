#!/usr/bin/env python3
"""Checks of the numpy DFlash reference (dflash_ref.py) against the spec's §11 vectors
(docs/spec/dflash.md) and its own invariants. The Rust drafter is compared with the
reference in crates/models/tests/dflash_ref.rs.

Run: python3 tests/reference/test_dflash_ref.py   (or pytest on this file)
"""

from __future__ import annotations

import os
import sys

import numpy as np

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dflash_ref as ref  # noqa: E402


class _Toy:
    """Just enough of a Draft for valid_context: one sliding layer W_d = 4 (ring of 8)."""
    windows = [4, 0]
    slots = [8, 16]
    valid_context = ref.Draft.valid_context


def test_sliding_mask_vectors():
    """§11.6: W_d = 4, ring 8: C1 = 10 -> slots {6, 7, 0, 1}; C1 = 3 -> {0, 1, 2}."""
    toy = _Toy()
    assert set(np.flatnonzero(toy.valid_context(0, 10))) == {6, 7, 0, 1}
    assert set(np.flatnonzero(toy.valid_context(0, 3))) == {0, 1, 2}
    # A global layer sees every written position.
    assert set(np.flatnonzero(toy.valid_context(1, 10))) == set(range(10))


def test_sliding_mask_equals_the_last_window_positions():
    """The ring rule shows exactly positions [C1 - W_d, C1), for every C1."""
    toy = _Toy()
    for c1 in range(1, 40):
        slots = np.flatnonzero(toy.valid_context(0, c1))
        want = {p % 8 for p in range(max(0, c1 - 4), c1)}
        assert set(slots) == want, (c1, slots, want)


def test_neox_rope_pairs_dim_0_with_dim_half():
    """§11.5: at position 1, dim 0 pairs with dim 64 (head_dim 128); position 0 is the identity."""
    x = np.zeros((1, 1, 128), np.float32)
    x[0, 0, 0] = 1.0
    y = ref.rope_neox(x, np.array([1]), 500000.0)
    nz = set(np.flatnonzero(np.abs(y[0, 0]) > 1e-7))
    assert nz == {0, 64}, nz
    assert np.allclose(y[0, 0, [0, 64]], [np.cos(1.0), np.sin(1.0)], atol=1e-6)
    z = np.random.default_rng(0).standard_normal((3, 2, 128)).astype(np.float32)
    assert np.array_equal(ref.rope_neox(z, np.zeros(3, np.int64), 500000.0), z)


def test_rms_norm_uses_the_weight_as_stored():
    """§2.2: no +1 on draft norms."""
    x = np.array([[3.0, 4.0]], np.float32)
    g = np.array([2.0, 0.5], np.float32)
    y = ref.rms_w(x, g, 0.0)
    rms = np.sqrt((9 + 16) / 2)
    assert np.allclose(y, [[3 / rms * 2, 4 / rms * 0.5]], rtol=1e-6)


if __name__ == "__main__":
    for name, fn in sorted(globals().items()):
        if name.startswith("test_") and callable(fn):
            fn()
            print(f"ok {name}")
