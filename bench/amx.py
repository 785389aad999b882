"""The VNNI grouped GEMM's AMX tiles (salon/kernels/cpu/w8a8_grouped_vnni.c) against its vpdpbusd loops, on a CPU
with AMX-INT8 whose kernel grants the tile state: the same bits, the int32 sums from the tile unit.

Two sections, each AMX against VNNI in alternated rounds (A B, B A, ...), a ratio per round:

  * `gemm`: the group32 GEMM on one copy of Gemma 3 270M's gate_up weights (640 -> 4,096), called again and again
    at its C entry point so they stay in the cores' L2 (bench.group32_gemm's resident_gmacs), at M = 8 (a decode
    of 8 sequences), 16, 64 and 512 rows, AMX at every size (below its default threshold of 64 rows too,
    salon.kernels.cpu.w8a8_grouped.amx_min_rows): `gemm_resident_m{M}_amx_over_vnni_x` (GMAC/s, above 1: AMX
    faster);
  * `model`: the int8 model through the engine's step path (bench.model's EngineSteps): a prompt's prefill of 512
    tokens in one step, as served (`model_pp512_amx_over_vnni_x`, tokens/s; also 2,048 tokens without --quick), and
    a 512-token prompt prefilled in steps of 32 and of 64 tokens with AMX at every size
    (`model_chunk{32,64}_amx_over_vnni_x`, tokens/s: what the threshold of 64 rows rests on; a long history's
    32-token chunks beside decodes are the dialogue trace's steps).

Without AMX (another CPU, or a kernel that refuses the tile state) nothing is measured: `"amx": false` and every
figure null. `peer: null` (the baseline is the same kernel's VNNI loop).

    python -m bench.amx [--quick] [--model gemma-3-270m] [--rounds N] [--threads N]
"""

from __future__ import annotations

import argparse
import contextlib
import json

import torch

from bench.group32_gemm import resident_gmacs
from bench.model import _prefill_tps
from salon.engine.model import load_model
from salon.kernels.cpu.w8a8_grouped import amx_min_rows, use_amx
from salon.loadgen.alternation import alternated_pairs, describe, paired_ratio

GEMM_ROWS = (8, 16, 64, 512)
CHUNKS = (32, 64)
CHUNKED_PROMPT = 512


@contextlib.contextmanager
def _amx_at_every_size():
    """AMX for calls of any row count inside (its threshold set to 0), the threshold restored after."""
    before = amx_min_rows(0)
    try:
        yield
    finally:
        amx_min_rows(before)


def _with_amx(on: bool, measure):
    """measure() with AMX on or off, then AMX back on."""
    use_amx(on)
    try:
        return measure()
    finally:
        use_amx(True)


def _ratio(result: dict, key: str, what: str, measure, rounds: int) -> None:
    """measure() with AMX against without it, alternated: result[key] = the ratio AMX / VNNI per round."""
    pairs = alternated_pairs(lambda: _with_amx(True, measure), lambda: _with_amx(False, measure), rounds)
    result[key] = ratio = paired_ratio(pairs, ("amx", "vnni"))
    print(
        describe(f"{what}, AMX over VNNI", ratio) + f"; AMX {ratio['amx_median']:.1f}, VNNI {ratio['vnni_median']:.1f}",
        flush=True,
    )


def gemm_section(result: dict, rounds: int, rows=GEMM_ROWS) -> None:
    """The group32 GEMM on L2-resident weights, AMX (at every M here) against VNNI."""
    gen = torch.Generator().manual_seed(0)
    with _amx_at_every_size():
        for m in rows:
            _ratio(
                result,
                f"gemm_resident_m{m}_amx_over_vnni_x",
                f"group32 GEMM, L2-resident gate_up, M = {m}, GMAC/s",
                lambda m=m: resident_gmacs(m, gen),
                rounds,
            )


def model_section(result: dict, model_name: str, rounds: int, quick: bool) -> None:
    """The model's prefill through the engine's step path: whole prompts as served, and chunked prompts with AMX at
    every size, AMX against VNNI."""
    model, _ = load_model(model_name, "int8", progress=False)
    _prefill_tps(model, 64, 1)  # every kernel library loaded before the switches are set
    for tokens in (512,) if quick else (512, 2048):
        _ratio(
            result,
            f"model_pp{tokens}_amx_over_vnni_x",
            f"{model_name} prefill of {tokens} tokens, tokens/s",
            lambda tokens=tokens: _prefill_tps(model, tokens, 1),
            rounds,
        )
    with _amx_at_every_size():
        for chunk in CHUNKS:
            _ratio(
                result,
                f"model_chunk{chunk}_amx_over_vnni_x",
                f"{model_name} prefill of {CHUNKED_PROMPT} tokens, {chunk} a step, tokens/s",
                lambda chunk=chunk: _prefill_tps(model, CHUNKED_PROMPT, 1, chunk),
                rounds,
            )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="3 rounds, pp512 only")
    parser.add_argument("--model", default="gemma-3-270m")
    parser.add_argument("--rounds", type=int, default=None, help="alternated rounds (default 7; --quick 3)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rounds = args.rounds or (3 if args.quick else 7)
    amx = use_amx()
    result: dict = {"amx": amx, "threads": args.threads, "rounds": rounds, "peer": None}
    if not amx:
        print(
            "no AMX here (the CPU lacks AMX-INT8, its kernel refuses the tile state, or SALON_CPU_AMX=0): "
            "nothing measured"
        )
    else:
        gemm_section(result, rounds)
        model_section(result, args.model, rounds, args.quick)
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
