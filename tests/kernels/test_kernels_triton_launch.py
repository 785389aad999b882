"""salon.kernels.triton_launch: one launcher per kernel and device type, one launch function per grid (no
fresh wrapper per launch), the launches still run the kernel, and an interpreted launch leaves triton.language as it
found it (a kernel compiled for a GPU later in the process builds)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from salon.kernels import rmsnorm
from salon.kernels.rmsnorm import rmsnorm_triton
from salon.kernels.triton_launch import on_device


def test_launcher_and_launch_are_kept():
    cpu = torch.device("cpu")
    launcher = on_device(rmsnorm._rmsnorm_rows_kernel, cpu)
    assert on_device(rmsnorm._rmsnorm_rows_kernel, cpu) is launcher
    assert launcher.kernel_name == "_rmsnorm_rows_kernel"
    assert launcher[(3,)] is launcher[(3,)]
    assert launcher[(3,)] is not launcher[(4,)]


def test_kept_launches_run_each_call_on_its_own_arguments():
    w = torch.ones(8)
    for seed in (0, 1):
        x = torch.randn(3, 8, generator=torch.Generator().manual_seed(seed))
        y = rmsnorm_triton(x, w, 1e-6)
        assert torch.allclose(y, x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6), atol=1e-6)


def test_an_interpreted_launch_leaves_triton_language_as_it_was():
    """Triton's interpreter patches triton.language while it runs and its own restore misses some of it; the launch
    restores the rest. Then a kernel not compiled before (a fresh one: no cache entry) still compiles for sm_90."""
    objects = (tl, tl.core, tl.math, tl.tensor)
    before = [dict(vars(obj)) for obj in objects]
    rmsnorm_triton(torch.randn(2, 8), torch.ones(8), 1e-6)
    for obj, attrs in zip(objects, before):
        now = dict(vars(obj))
        assert set(now) == set(attrs), obj
        assert [n for n in attrs if now[n] is not attrs[n]] == [], obj

    @triton.jit
    def fresh(x_ptr, salt: tl.constexpr):  # a source of its own, so nothing cached stands in for the compilation
        i = tl.program_id(0).to(tl.int64)
        tl.store(x_ptr + i, tl.load(x_ptr + i) * 2.0 + salt)

    source = ASTSource(fn=fresh, signature={"x_ptr": "*fp32", "salt": "constexpr"}, constexprs={"salt": 1.5})
    ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"enable_fp_fusion": False}).asm["ptx"]
    assert "ld.global" in ptx
