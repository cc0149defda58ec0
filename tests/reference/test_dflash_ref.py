#!/usr/bin/env python3
"""Checks of the numpy DFlash reference (dflash_ref.py): known vectors (ggml's top-k order,
NeoX RoPE pairs, norms as stored) and its own invariants (the DFlash2 convolution is causal
inside the block). The Rust drafter is compared with the
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


def test_top_k_order_is_ggmls():
    """ggml-cpu top_k: descending (ties by lower id), then the first two swapped."""
    z = np.array([0.5, 3.0, -1.0, 2.0, 3.0, 1.0], np.float32)
    assert ref.top_k_ggml(z, 4) == [4, 1, 3, 5]


def test_conv_is_causal_inside_the_block():
    """DFlash2 convolution: row t mixes rows t, t-1, ..., t-K+1 of the block only."""
    class _C:
        K, G, dim = 3, 2, 4
        conv = ref.Draft.conv
    c = _C()
    b = 5
    x = np.zeros((b, 4), np.float32)
    x[2] = 1.0                                   # an impulse at row 2
    base = np.ones((2, 3, 4), np.float32)
    dyn = np.zeros((b, 2 * 3 * 2), np.float32)
    y = c.conv(x, dyn, base, 0)
    assert np.allclose(y[:2], 0) and np.allclose(y[2:5], 1.0)   # rows 2, 3, 4 see it (taps 0..2)
    y = c.conv(x, dyn, base * 0, 0)
    assert np.allclose(y, 0)


def test_neox_rope_pairs_dim_0_with_dim_half():
    """§11.5: at position 1, dim 0 pairs with dim 64 (head_dim 128); position 0 is the identity."""
    x = np.zeros((1, 1, 128), np.float32)
    x[0, 0, 0] = 1.0
    y = ref.rope_neox(x, np.array([1]), 10000.0)
    nz = set(np.flatnonzero(np.abs(y[0, 0]) > 1e-7))
    assert nz == {0, 64}, nz
    assert np.allclose(y[0, 0, [0, 64]], [np.cos(1.0), np.sin(1.0)], atol=1e-6)
    z = np.random.default_rng(0).standard_normal((3, 2, 128)).astype(np.float32)
    assert np.array_equal(ref.rope_neox(z, np.zeros(3, np.int64), 10000.0), z)


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
