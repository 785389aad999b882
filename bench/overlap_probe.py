"""How much of a GEMM's instruction time this CPU hides under its weights' stream (bench/overlap_probe.c).

A decode step of a few sequences reads every weight once and makes a few products with each byte: it can take as
little as the stream alone only if the cores hide the products' instructions under it. The probe streams a
buffer of a step's size (Gemma 3 270M's 291 MB of weights and scales) with a measured amount of work per
512-byte unit, in two instruction mixes, and times it against the stream alone in alternated rounds (a ratio
per round), and against the same instructions on L2-resident data (their time without memory):

  * thin: vpdpbusd with register operands, few micro-ops per product;
  * kernel: the VNNI grouped GEMM's own mix per activation row of a group (8 vpdpbusd on activation bytes
    broadcast from memory, two chains, then the group's float step), `rows` rows per unit: rows 8 is what a
    batch-8 decode step's GEMMs do per weight byte.

The kernel mix at 8 rows over 1 row, alternated, is what a batch-8 step's GEMMs over batch 1's come to with this
mix on this CPU. `bench.step_profile` gives a step's own figures for comparison (its resident floor: the products'
time without memory). Where the kernel mix's stream takes much more than the larger of the stream and its
instructions, a batch's step cannot approach batch 1's by scheduling alone: it needs fewer instructions per weight
byte.

    python -m bench.overlap_probe [--quick] [--threads N] [--mb 291] [--rounds N]
"""

from __future__ import annotations

import argparse
import ctypes
import json
from pathlib import Path

import torch

from salon.kernels.cpu import native
from salon.loadgen.alternation import alternated_pairs, describe, paired_ratio

WINDOW = 256 << 10  # each thread's L2-resident bytes, for the instructions-only time
MIXES = {"thin": 0, "kernel": 1}
LEVELS = {"thin": (8, 16, 32, 64), "kernel": (1, 2, 4, 8)}
QUICK_LEVELS = {"thin": (16, 32), "kernel": (1, 4, 8)}


class Probe:
    def __init__(self, nbytes: int, threads: int) -> None:
        c_int, c_i64, ptr = ctypes.c_int, ctypes.c_int64, ctypes.c_void_p
        signature = ([c_int, ptr, c_i64, c_i64, c_i64, ptr, c_int], ctypes.c_double)
        self.lib = native.load(Path(__file__).with_name("overlap_probe.c"), {"overlap_seconds": signature})
        self.threads = threads
        self.nbytes = max(nbytes, threads * WINDOW)
        self.buf = torch.ones(self.nbytes, dtype=torch.uint8)
        gen = torch.Generator().manual_seed(0)
        rows = torch.randint(-128, 128, (2048,), dtype=torch.int8, generator=gen)
        scales = (torch.rand(512, generator=gen) + 0.5).view(torch.int8)
        self.act = torch.cat([rows, scales])

    def seconds(self, mix: str, work: int, resident: bool = False) -> float:
        """One run: the stream with `work` of the mix per 512 bytes (work 0: the stream alone; resident: over each
        thread's L2-resident window instead)."""
        window = WINDOW if resident else 0
        args = (MIXES[mix], self.buf.data_ptr(), self.nbytes, window, work, self.act.data_ptr(), self.threads)
        return self.lib.overlap_seconds(*args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--mb", type=float, default=291.1, help="the stream's size (a step's weight bytes)")
    parser.add_argument("--rounds", type=int, default=None, help="alternated rounds (default 5, --quick 3)")
    args = parser.parse_args()
    rounds = args.rounds or (3 if args.quick else 5)
    result: dict = {"threads": args.threads, "stream_bytes": int(args.mb * 1e6), "rounds": rounds, "peer": None}
    if native.cpu_isas()[:1] != ("vnni",):
        print("the probe runs the VNNI kernel's instructions: this CPU has no AVX-512 VNNI")
        print("RESULT " + json.dumps({**result, "vnni": False}))
        return
    probe = Probe(result["stream_bytes"], args.threads)
    if probe.lib is None:
        print("the probe could not be built (no C compiler)")
        print("RESULT " + json.dumps({**result, "vnni": True, "built": False}))
        return
    for mix in MIXES:  # first-call costs (page faults of the buffer, the build) in no round
        probe.seconds(mix, 1)
    alone = [probe.seconds("thin", 0) for _ in range(rounds)]
    stream = min(alone)
    result["stream_ms"] = round(stream * 1e3, 3)
    result["stream_gbps"] = round(probe.nbytes / stream / 1e9, 2)
    print(
        f"threads {args.threads}; a stream of {probe.nbytes / 1e6:.1f} MB alone: {stream * 1e3:.2f} ms "
        f"({probe.nbytes / stream / 1e9:.1f} GB/s, best of {rounds})"
    )
    for mix, levels in (QUICK_LEVELS if args.quick else LEVELS).items():
        for work in levels:
            key = f"{mix}_{work}"
            resident = min(probe.seconds(mix, work, resident=True) for _ in range(3))
            ratio = paired_ratio(
                alternated_pairs(
                    lambda mix=mix, work=work: probe.seconds(mix, work), lambda: probe.seconds("thin", 0), rounds
                ),
                ("streamed", "stream"),
            )
            streamed = ratio["streamed_median"]
            larger = max(ratio["stream_median"], resident)
            result[f"{key}_resident_ms"] = round(resident * 1e3, 3)
            result[f"{key}_streamed_ms"] = round(streamed * 1e3, 3)
            result[f"{key}_streamed_over_stream_x"] = ratio
            result[f"{key}_streamed_over_larger_x"] = round(streamed / larger, 3)
            if mix == "kernel" and work != 1:  # a batch's GEMMs over batch 1's, as the step's target compares them
                over_one = paired_ratio(
                    alternated_pairs(lambda work=work: probe.seconds(mix, work), lambda: probe.seconds(mix, 1), rounds),
                    (f"rows_{work}", "rows_1"),
                )
                result[f"{key}_over_kernel_1_x"] = over_one
                print(describe(f"kernel {work} rows over 1 row, both with the stream", over_one))
            unit = "vpdpbusd" if mix == "thin" else "activation rows"
            print(
                f"{mix:6s} {work:2d} {unit} per 512 bytes: instructions alone {resident * 1e3:6.2f} ms, with the "
                f"stream {streamed * 1e3:6.2f} ms ({streamed / larger:.2f}x the larger); "
                + describe("with the stream over the stream alone", ratio)
            )
    print("RESULT " + json.dumps({**result, "vnni": True, "built": True}))


if __name__ == "__main__":
    main()
