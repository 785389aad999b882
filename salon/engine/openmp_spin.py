"""How long the engine's OpenMP threads spin at a barrier before they sleep in the kernel.

libgomp spins about 300,000 times by default (3.4 ms at 11 ns a `pause`) before a waiting thread sleeps. On cores of
the engine's own that costs nothing; beside any other busy process it is ruinous: a team member preempted by the
neighbour holds up every barrier while its teammate spins out its time slice instead of giving the core back. On 2
cores, one process busy-looping on one of them made a served Gemma 3 decode step 45x slower (38-53x over alternated
rounds). Bounded at SPIN_COUNT, the threads still spin through a forward pass's barriers but sleep in its longer
gaps and between steps: served decode and prefill took the same time on an idle host (alternated engines), and the
same neighbour cost 1.9x (tests/engine/test_engine_openmp_team.py). The neighbours are real: the gateway and
kvstore share the engine's cores under `salon up`, as do the engine's own grammar compile workers and whatever else
runs on a laptop or an unpinned pod.

libgomp reads the setting once, when it loads (with torch), so the engine's entry point sets it before anything
imports torch. An operator's own GOMP_SPINCOUNT or OMP_WAIT_POLICY is left as it is.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

SPIN_COUNT = 3000  # about 34 us at 11 ns a pause
OPERATOR_CHOICES = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")  # either one set: the engine sets nothing


def bound_openmp_spin(environ: MutableMapping[str, str] = os.environ) -> None:
    """Sets GOMP_SPINCOUNT to SPIN_COUNT unless the environment chose a spin or a wait policy. Raises if torch (and
    with it libgomp, which would ignore the setting) is already loaded."""
    if "torch" in sys.modules:
        raise RuntimeError("the OpenMP spin must be set before torch is imported: libgomp reads it once, as it loads")
    if not any(name in environ for name in OPERATOR_CHOICES):
        environ["GOMP_SPINCOUNT"] = str(SPIN_COUNT)
