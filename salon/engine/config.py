"""The engine's one configuration dataclass, built in __main__ from flags/env (SALON_ENGINE_*)."""

from __future__ import annotations

from dataclasses import dataclass, field

from salon.common.server import ServerConfig


@dataclass(frozen=True)
class SchedulerConfig:
    """Knobs of continuous batching (see core/scheduler.py)."""

    max_num_batched_tokens: int = field(
        default=256, metadata={"help": "token budget of one step, shared by decodes (1 each) and prefill chunks"}
    )
    max_num_running: int = field(default=64, metadata={"help": "largest running batch"})
    max_waiting_requests: int = field(
        default=256, metadata={"help": "requests waiting for admission before new ones get RESOURCE_EXHAUSTED"}
    )
    long_prefill_tokens: int = field(
        default=32,
        metadata={
            "help": "the most tokens long prefills (prompts that do not fit the budget) take in a "
            "step that also holds interactive work (decodes, prompts that fit the budget, "
            "returning turns after a cache hit); 0: no such classes, every request in "
            "arrival order (core/scheduler.py). Smaller keeps those steps shorter (returning "
            "turns' TTFT and ITL) for fewer turns/s: on the dialogue trace 8 instead of 32 "
            "gave 0.86-0.90x the steady turns/s for 0.73x the ITL and 0.91x the returning "
            "turns' TTFT p90 (measured by `salon bench --launch --preset llama-server`, "
            "docs/benchmarks.md); a GPU step's fixed cost wants more"
        },
    )
    long_prefill_solo_tokens: int = field(
        default=32,
        metadata={
            "help": "the most tokens long prefills take in a step of their own (no interactive "
            "work in it), with long_prefill_tokens > 0; 0: the whole budget. A returning "
            "turn that arrives during such a step waits for it to end, so this bounds its "
            "queueing: on a CPU a step of 256 prefill tokens is about a second on one "
            "thread, and the prefill's throughput is the same in chunks of 64"
        },
    )
    speculative_tokens: int = field(
        default=0,
        metadata={
            "help": "draft tokens verified per decode step (speculative decoding from the request's "
            "own context, exact: the same tokens as without it); 0: off"
        },
    )
    speculative_max_rows: int = field(
        default=8,
        metadata={
            "help": "draft tokens only while the step's decodes with their drafts stay within "
            "this many rows (a decode step's cost is nearly flat in its rows up to a few; "
            "0: no cap)"
        },
    )
    ngram_min: int = field(default=2, metadata={"help": "shortest context suffix (tokens) a draft is looked up by"})
    ngram_max: int = field(default=4, metadata={"help": "longest context suffix (tokens) a draft is looked up by"})


@dataclass(frozen=True)
class EngineConfig:
    """salon engine: one model replica serving salon.engine.v1.EngineService."""

    server: ServerConfig = field(default_factory=ServerConfig)
    model: str = field(default="gemma-3-270m", metadata={"help": "gemma-3-270m | synthetic-tiny | ..."})
    precision: str = field(default="int8", metadata={"help": "int8 | float32 weights"})
    kv_dtype: str = field(
        default="auto",
        metadata={
            "help": "KV cache values: int8 (+ a float32 scale per token and head) | bfloat16 | float32 | auto "
            "(int8 with --precision int8, float32 with float32: the exact reference path)"
        },
    )
    engine_id: str = field(default="e0", metadata={"help": "stable id of this replica (load reports, finals)"})
    device: str = field(default="cpu", metadata={"help": "torch device (cpu | cuda | cuda:N)"})
    kernels: str = field(
        default="auto",
        metadata={
            "help": "op family: auto (triton on cuda, the C kernels on cpu) | triton (on cpu: Triton's interpreter, "
            "slow, for checks) | cpu | ref (plain PyTorch)"
        },
    )
    cuda_graphs: str = field(
        default="on",
        metadata={
            "help": "on | off: decode steps replayed from CUDA graphs, padded to batch sizes 1, 2, 4, 8, 16, 24, "
            "... (effective only on CUDA with the Triton kernels; steps with prefill or draft tokens run eagerly)"
        },
    )
    activations: str = field(
        default="auto",
        metadata={
            "help": "activation recipe of the int8 Linears: two_terms (two int8 terms, ~14 bits) | int16 (one int16 "
            "term, ~15 bits: more products a second than two terms on CPUs without VNNI, measured by "
            "`python -m bench.gemv --int16`) | group32 (one int8 term per token and 32 channels in the decoder "
            "layers' Linears, half the products of two terms, and the output projection rescored: group32, with two "
            "terms for the rows that could be the largest; C kernels on "
            "the CPU, Triton on a GPU) | auto (group32 for Gemma 3, which meets the quality gates with it; for other "
            "architectures int16 where the CPU family's GEMM is AVX2's, else two_terms). The recipes' numbers "
            "differ, so each has its own KV cache namespace"
        },
    )
    block_size_tokens: int = field(default=16, metadata={"help": "tokens per KV block"})
    kv_cache_bytes: int = field(default=1 << 30, metadata={"help": "bytes of paged KV cache (values + scales)"})
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    default_max_new_tokens: int = field(default=256, metadata={"help": "max_new_tokens when the request gives 0"})
    max_new_tokens_limit: int = field(default=8192, metadata={"help": "largest max_new_tokens accepted"})
    max_context_tokens: int | None = field(default=None, metadata={"help": "context limit (default: the model's own)"})
    torch_threads: int = field(
        default=0,
        metadata={
            "help": "intra-op threads for the model (0: all cores); engines sharing a host "
            "should split the cores, oversubscribed threads spin and slow every step"
        },
    )
    step_nice: int = field(
        default=10,
        metadata={
            "help": "added to the step thread's nice value (and its kernel threads'): the event "
            "loop and the gateway and kvstore on the same cores run first when they "
            "have work; 0: unchanged"
        },
    )
    warmup: bool = field(default=True, metadata={"help": "run one short request before reporting SERVING"})
    grammar_cache_bytes: int = field(
        default=256 << 20, metadata={"help": "bytes of compiled constraints kept (structured output), LRU"}
    )
    grammar_compile_timeout_s: float = field(
        default=10.0,
        metadata={"help": "CPU time a constraint may compile for before a 400 (its worker process is killed)"},
    )
    grammar_compile_wait_s: float = field(
        default=60.0,
        metadata={
            "help": "longest a compilation may take in all (its workers wait while the model computes) before a 429"
        },
    )
    grammar_compile_busy_steps: int = field(
        default=8,
        metadata={
            "help": "while the model computes, the compile workers run during one step in this many once it has "
            "computed for 0.25 s without idling (paused otherwise); 0: only while the engine idles"
        },
    )
    grammar_compile_workers: int = field(
        default=2, metadata={"help": "worker processes compiling constraints; 0: threads of the engine process"}
    )
    grammar_compile_nice: int = field(
        default=19,
        metadata={"help": "added to the compile workers' nice value: below the step thread's, so the step comes first"},
    )
    no_prefix_cache: bool = field(
        default=False, metadata={"help": "disable prefix caching (device and kvstore): recompute every prompt"}
    )
    kvstore_target: str | None = field(
        default=None, metadata={"help": "host:port of this host's kvstore (cross-turn KV cache); none: device only"}
    )
    kvstore_shared_memory: bool = field(
        default=True, metadata={"help": "move KV through the kvstore's shared-memory arena (same host only)"}
    )
    kvstore_timeout_s: float = field(
        default=1.0, metadata={"help": "longest wait for a kvstore lookup before recomputing instead"}
    )
    kvstore_tls_ca_file: str | None = field(
        default=None, metadata={"help": "CA of the kvstore's certificate: talk TLS to the kvstore"}
    )
    kvstore_tls_cert_file: str | None = field(
        default=None, metadata={"help": "our client certificate for the kvstore (mutual TLS)"}
    )
    kvstore_tls_key_file: str | None = field(default=None, metadata={"help": "key of kvstore_tls_cert_file"})
    kvstore_shm_dir: str = field(
        default="/dev/shm/salon-kvstore",
        metadata={"help": "the kvstore's --shm-dir: an arena is mapped only from inside it"},
    )
    kvstore_arena_uid: int | None = field(
        default=None, metadata={"help": "uid that must own the kvstore's arena (default: this process's)"}
    )

    def cuda_graphs_on(self) -> bool:
        """cuda_graphs as a bool; ValueError for a value other than on or off."""
        if self.cuda_graphs not in ("on", "off"):
            raise ValueError(f"--cuda-graphs: expected on or off, got {self.cuda_graphs!r}")
        return self.cuda_graphs == "on"

    def resolved_kv_dtype(self) -> str:
        """kv_dtype with "auto" resolved from the precision."""
        if self.kv_dtype != "auto":
            return self.kv_dtype
        return "float32" if self.precision == "float32" else "int8"
