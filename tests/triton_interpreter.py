"""Triton's interpreter with a tl.dot whose rows do not depend on each other, for tests that check the
Triton kernels' batch invariance without a GPU.

The interpreter's tl.dot is a numpy BLAS call whose rounding depends on a row's place in the tile (BLAS picks
its kernel and summation order by shape), which a GPU's MMA does not do. `row_independent_dot` swaps in a
per-element dot with one fixed summation order."""

from __future__ import annotations

from triton.runtime import interpreter


def _create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
    acc_dtype = d.data.dtype
    products = a.data.astype(acc_dtype)[:, :, None] * b.data.astype(acc_dtype)[None, :, :]
    return interpreter.TensorHandle(products.sum(axis=1, dtype=acc_dtype) + d.data, d.dtype.scalar)


def row_independent_dot(monkeypatch) -> None:
    """Patch the interpreter (for the monkeypatch's scope): every tl.dot row is computed on its own."""
    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_dot", _create_dot)
