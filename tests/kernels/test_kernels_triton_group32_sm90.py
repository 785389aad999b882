"""The group32 Triton kernels compiled for an H100 (sm_90) without one: Triton compiles a kernel for a named GPU
target on any machine, so the PTX of each launch the launchers make is read here. The GEMM at each of its GPU tiles
rounds every product and sum on its own (no fused multiply-add) on int8 tensor-core dots, and so does the same kernel
giving the rescored output projection's two-term values too; the fused norm and quantization sums a row's squares
with exactly the operations of rmsnorm_triton (the same tree of additions over the same loaded values, the same warp
shuffles), which is what makes its bits the unfused pair's on the GPU. The launches' arguments are the launchers'
own, recorded from CPU calls."""

from __future__ import annotations

import re

import pytest
import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from salon.kernels import rmsnorm
from salon.kernels import w8a8_group32_triton as group32

SM90 = GPUTarget("cuda", 90, 32)
OPTIONS = ("num_warps", "num_stages", "enable_fp_fusion")
_TYPES = {torch.float32: "*fp32", torch.int8: "*i8"}


class Recorder:
    """Stands in for on_device(kernel, device)[grid]: records the kernel and its launch's arguments."""

    def __init__(self, launches: list) -> None:
        self.launches = launches

    def __call__(self, kernel, device):
        launches = self.launches

        class Launch:
            def __getitem__(self, grid):
                return lambda *args, **kwargs: launches.append((kernel, args, kwargs))

        return Launch()


def recorded(monkeypatch, module, call) -> tuple:
    launches: list = []
    monkeypatch.setattr(module, "on_device", Recorder(launches))
    call()
    (launch,) = launches
    return launch


def sm90_ptx(kernel, args, kwargs) -> str:
    """PTX of the launch as the compiled launcher makes it (enable_fp_fusion=False unless the call says otherwise;
    16-byte aligned tensors and integer arguments divisible by 16 carry Triton's divisibility hint)."""
    params = [p for p in kernel.params if not p.is_constexpr]
    signature, attrs = {}, {}
    for i, (param, value) in enumerate(zip(params, args)):
        if isinstance(value, torch.Tensor):
            signature[param.name] = _TYPES[value.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(value, float):
            signature[param.name] = "fp32"
        else:
            signature[param.name] = "i32"
            if value % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    constexprs = {k: v for k, v in kwargs.items() if k not in OPTIONS}
    signature |= {name: "constexpr" for name in constexprs}
    options = {k: kwargs[k] for k in OPTIONS if k in kwargs} | {
        "enable_fp_fusion": kwargs.get("enable_fp_fusion", False)
    }
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(source, target=SM90, options=options).asm["ptx"]


def sum_of_squares_tree(ptx: str) -> str:
    """The expression the kernel divides by K: its additions and products over the loaded values (named in load
    order), warp shuffles and the shared-memory exchange, up to the first division."""
    env: dict[str, str] = {}
    loads, stored = 0, ""
    for line in ptx.splitlines():
        line = line.strip()
        if m := re.match(r"(@%p\d+ )?ld\.global\.(v\d\.)?b32 \{ ([^}]*) \}", line):
            for reg in m.group(3).split(","):
                env[reg.strip()] = f"x{loads}"
                loads += 1
        elif m := re.match(r"(mul|add)\.rn\.f32\s+(%r\d+), (%r\d+), (%r\d+);", line):
            a, b = sorted(env.get(r, r) for r in m.group(3, 4))
            env[m.group(2)] = f"({a}{'*' if m.group(1) == 'mul' else '+'}{b})"
        elif m := re.match(r"shfl\.sync\.bfly\.b32\s+(%r\d+), (%r\d+), (\d+)", line):
            env[m.group(1)] = f"lane^{m.group(3)}[{env.get(m.group(2))}]"
        elif m := re.match(r"st\.shared\.b32\s+\[[^\]]*\], (%r\d+);", line):
            stored = env.get(m.group(1), "")
        elif m := re.match(r"ld\.shared\.b32\s+(%r\d+), \[", line):
            env[m.group(1)] = f"warps[{stored}]"
        elif m := re.match(r"div\.\w+\.f32\s+%r\d+, (%r\d+), %r\d+;", line):
            return env.get(m.group(1), "")
    raise AssertionError("no division in the kernel")


@pytest.mark.parametrize("k", [96, 576, 640, 2048])
def test_fused_norm_sums_squares_as_rmsnorm_triton(monkeypatch, k):
    x, w = torch.randn(2, k), torch.rand(k) + 0.5
    fused = recorded(monkeypatch, group32, lambda: group32.rmsnorm_quant_group32_triton(x, w, 1e-6))
    plain = recorded(monkeypatch, rmsnorm, lambda: rmsnorm.rmsnorm_triton(x, w, 1e-6))
    fused_tree, plain_tree = sum_of_squares_tree(sm90_ptx(*fused)), sum_of_squares_tree(sm90_ptx(*plain))
    assert fused_tree.count("x") >= 4 and "lane^1" in fused_tree  # a real reduction was read
    assert fused_tree == plain_tree


@pytest.mark.parametrize("m, n", [(1, 640), (1, 4096), (64, 1536), (256, 640)])
@pytest.mark.parametrize("two_terms_too", [False, True])
def test_gemm_rounds_each_product_and_sum_on_int8_tensor_cores(monkeypatch, m, n, two_terms_too):
    """The group32 GEMM, and the same kernel giving the two-term values too (the rescored output projection's)."""
    a_q = torch.zeros(m, 640, dtype=torch.int8)
    a_scale, w_q, w_scale = torch.ones(m, 20), torch.zeros(n, 640, dtype=torch.int8), torch.ones(n, 20)
    gpu_config = group32._group32_config(m, n, torch.device("cuda"), two_terms_too)
    monkeypatch.setattr(group32, "_group32_config", lambda *_: gpu_config)  # the GPU's tiles, not the CPU's
    if two_terms_too:
        t_q, t_scale = torch.zeros(2 * m, 640, dtype=torch.int8), torch.ones(2 * m)
        call = lambda: group32.w8a8_group32_two_terms_triton(a_q, a_scale, t_q, t_scale, w_q, w_scale)  # noqa: E731
    else:
        call = lambda: group32.w8a8_group32_triton(a_q, a_scale, w_q, w_scale, torch.zeros(m, n))  # noqa: E731
    kernel, args, kwargs = recorded(monkeypatch, group32, call)
    assert kwargs["BLOCK_M"] == gpu_config["BLOCK_M"] and kwargs["enable_fp_fusion"] is False
    assert kwargs["TWO_TERMS_TOO"] is two_terms_too
    assert not two_terms_too or kwargs["BLOCK_M"] * kwargs["BLOCK_N"] <= 64 * 64  # three accumulators a tile
    ptx = sm90_ptx(kernel, args, kwargs)
    assert "fma.rn.f32" not in ptx and "mul.rn.f32" in ptx and "add.rn.f32" in ptx
    int8_mma = r"mma\.sync\.aligned\.\w+\.row\.col(\.satfinite)?\.s32\.s8\.s8\.s32|wgmma\.mma_async\.\S*\.s32\.s8\.s8"
    assert re.search(int8_mma, ptx)  # exact int32 sums (satfinite never binds: |acc_g| < 2**24)
