"""salon.kernels.triton_launch: one launcher per kernel and device type, one launch function per grid (no
fresh wrapper per launch), and the launches still run the kernel."""

from __future__ import annotations

import torch

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
