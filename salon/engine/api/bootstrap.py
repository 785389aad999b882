"""The engine as a salon.common.server Service: load + warm the model off the loop, then SERVING.

Only gateway identities may call it (access_policy). Its kvstore link is checked at start like its
own listener (salon/common/internal_auth.py). If the step thread dies, the engine reports
NOT_SERVING and exits (EXIT_FATAL) for its supervisor to restart it.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import grpc
import torch

from salon.common import internal_auth
from salon.common.logging import get_logger
from salon.common.peer_identity import AccessPolicy
from salon.common.prefix_hash import namespace_digest
from salon.common.server import HealthState
from salon.engine import metrics
from salon.engine.api.prompt import PromptRenderer
from salon.engine.api.servicer import EngineRuntime, EngineServicer, add_to_server
from salon.engine.api.validation import Limits
from salon.engine.config import EngineConfig
from salon.engine.core.background import BackgroundGate
from salon.engine.core.engine_core import EngineCore, warmup
from salon.engine.core.engine_loop import EngineLoop
from salon.engine.grammar.compiler import GrammarCompiler, GrammarLimits
from salon.engine.kv.kv_transfer import host_layout, layout_tag
from salon.engine.model.chat_renderer import ChatRenderer
from salon.engine.model.sampling_defaults import SamplingDefaults
from salon.engine.prefix.host_cache import HostCache
from salon.engine.resident import ResidentMeter
from salon.engine.worker.model_loading import load_serving_model
from salon.kernels.cpu.w8a8_grouped import packed_bytes

log = get_logger(__name__)


def build_engine(config: EngineConfig) -> tuple[EngineCore, ChatRenderer, SamplingDefaults]:
    """The engine core (warmed up unless told not to), the model's chat renderer and default sampling."""
    if config.torch_threads > 0:
        torch.set_num_threads(config.torch_threads)
    loaded = load_serving_model(config.model, config.precision, config.device, config.kernels, config.activations)
    core = EngineCore(
        loaded.model,
        loaded.tokenizer,
        config.scheduler,
        config.block_size_tokens,
        config.kv_cache_bytes,
        config.device,
        prefix_caching=not config.no_prefix_cache,
        kv_dtype=config.resolved_kv_dtype(),
        kernels=config.kernels,
        cuda_graphs=config.cuda_graphs_on(),
        max_context_tokens=config.max_context_tokens,
    )
    if config.warmup:
        warmup(core)
    return core, loaded.chat, loaded.sampling


async def build_engine_on_a_passing_thread(config: EngineConfig) -> tuple[EngineCore, ChatRenderer, SamplingDefaults]:
    """build_engine on a thread of its own that ends when it returns, so that the step thread's OpenMP team is
    the process's only one. libgomp keeps a pool of workers for every thread that has run a parallel region, for as
    long as that thread lives, and counts them all: once they outnumber the cores it may use, a thread waiting at a
    barrier spins 100 times instead of its full count (salon.engine.openmp_spin) before it sleeps in the kernel, so
    every barrier of every kernel costs a futex sleep and a wake-up. Loading on the event loop's executor (a thread
    that lives on) left such a pool beside the step thread's: on 2 cores the step threads slept 6,500 times a second
    and the cores sat a third idle while steps took twice their time (tests/engine/test_engine_openmp_team.py)."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine-load")
    try:
        return await asyncio.get_running_loop().run_in_executor(pool, build_engine, config)
    finally:
        pool.shutdown(wait=False)  # its thread ends, and its OpenMP workers with it


def build_core(config: EngineConfig) -> EngineCore:
    return build_engine(config)[0]


def cache_layout_tag(core: EngineCore) -> str:
    """The layout tag of the engine's KV: its layout, the model's numerics and the kernel family."""
    return layout_tag(core.layout, core.model.numerics, core.kernel_family)


def namespace_function(core: EngineCore):
    """salt -> the engine's cache namespace digest for that tenant (model, layout tag, salt), memoized."""
    tag = cache_layout_tag(core)
    model_id = core.config.model_id
    cache: dict[str, bytes] = {}

    def namespace_of(salt: str) -> bytes:
        digest = cache.get(salt)
        if digest is None:
            digest = cache[salt] = namespace_digest(model_id, tag, salt)
        return digest

    return namespace_of


class EngineService:
    name = "engine"
    access_policy = AccessPolicy({"/salon.engine.v1.EngineService/": frozenset({"gateway"})})

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.servicer = EngineServicer(config)
        self._loop: EngineLoop | None = None
        self._host: HostCache | None = None
        self._task: asyncio.Task | None = None

    def _kvstore_tls(self):
        config = self.config
        return internal_auth.client_tls_or_none(
            "--kvstore-tls", config.kvstore_tls_ca_file, config.kvstore_tls_cert_file, config.kvstore_tls_key_file
        )

    async def start(self, server: grpc.aio.Server, health: HealthState) -> list[str]:
        if self.config.kvstore_target and not self.config.no_prefix_cache:
            internal_auth.check_client(
                self.config.server.internal_auth, self._kvstore_tls(), "--kvstore-tls", [self.config.kvstore_target]
            )
        names = [add_to_server(self.servicer, server)]
        self.servicer.health = health
        self._task = asyncio.create_task(self._load(health))
        return names

    async def _load(self, health: HealthState) -> None:
        try:
            core, chat, sampling_defaults = await build_engine_on_a_passing_thread(self.config)
        except Exception:
            log.exception("model_load_failed", model=self.config.model)
            raise
        model_cfg = core.config
        metrics.set_model(model_cfg.model_id, self.config.engine_id)
        context = min(model_cfg.max_context_tokens, self.config.max_context_tokens or model_cfg.max_context_tokens)
        self._loop = EngineLoop(
            core, asyncio.get_running_loop(), on_fatal=health.fatal, step_nice=self.config.step_nice
        )
        host_cache = self._host_cache(core)
        if host_cache is not None:
            loop = asyncio.get_running_loop()
            core.set_host_sink(lambda put: loop.call_soon_threadsafe(host_cache.store, put))
        self._host = host_cache
        if host_cache is not None:
            host_cache.client.start()  # maps the kvstore's arena in the background
        grammars = GrammarCompiler(
            core.tokenizer,
            tuple(sorted(set(model_cfg.eos_token_ids) | set(chat.stop_token_ids))),
            GrammarLimits(
                self.config.grammar_cache_bytes,
                self.config.grammar_compile_timeout_s,
                self.config.grammar_compile_workers,
                self.config.grammar_compile_nice,
                compile_wait_s=self.config.grammar_compile_wait_s,
            ),
        )
        self._loop.background = BackgroundGate(
            grammars.pause_workers, grammars.resume_workers, self.config.grammar_compile_busy_steps
        )
        self._loop.start()
        renderer = PromptRenderer(chat)
        self.servicer.runtime = EngineRuntime(
            loop=self._loop,
            tokenizer=core.tokenizer,
            limits=Limits(
                vocab_size=model_cfg.vocab_size,
                max_context_tokens=context,
                default_max_new_tokens=self.config.default_max_new_tokens,
                max_new_tokens_limit=self.config.max_new_tokens_limit,
                max_token_bytes=max(len(core.tokenizer.decode([i]).encode()) for i in range(model_cfg.vocab_size)),
                message_overhead_tokens=renderer.message_overhead_tokens,
                prompt_overhead_tokens=renderer.prompt_overhead_tokens,
                character_overhead_tokens=renderer.character_overhead_tokens,
            ),
            model_config=model_cfg,
            chat=chat,
            sampling_defaults=sampling_defaults,
            block_size_tokens=self.config.block_size_tokens,
            namespace_of=None if self.config.no_prefix_cache else self._namespace_of(core),
            host_cache=host_cache,
            sliding_window_tokens=max((layer.sliding_window_tokens or 0 for layer in model_cfg.layers), default=0),
            kv_bytes_per_token=core.layout.page_bytes // core.layout.block_size_tokens,
            grammars=grammars,
            resident=ResidentMeter(
                core.model.weight_bytes() + packed_bytes(),
                core.kv_cache.allocated_bytes(),
                self.config.kvstore_shm_dir if host_cache is not None else None,
            ),
        )
        log.info(
            "engine_ready",
            model=model_cfg.model_id,
            precision=core.model.precision,
            activations=core.model.kernel_ops.activations if core.model.precision == "int8" else None,
            kernels=core.kernel_family,
            kv_blocks=core.layout.num_blocks,
            kv_bytes=core.layout.capacity_bytes,
            kv_groups=len(core.layout.groups),
            threads=torch.get_num_threads(),
        )
        await health.set_serving()

    def _host_cache(self, core: EngineCore) -> HostCache | None:
        if self.config.no_prefix_cache or not self.config.kvstore_target:
            return None
        from salon.common.kvstore_contract.client import KVStoreClient

        config = self.config
        client = KVStoreClient(
            config.kvstore_target,
            use_shared_memory=config.kvstore_shared_memory,
            timeout_s=config.kvstore_timeout_s,
            tls=self._kvstore_tls(),
            arena_dir=config.kvstore_shm_dir,
            arena_owner_uid=config.kvstore_arena_uid,
        )
        return HostCache(
            client,
            host_layout(core.layout),
            timeout_s=config.kvstore_timeout_s,
            model_id=core.config.model_id,
            layout_tag=cache_layout_tag(core),
        )

    def _namespace_of(self, core: EngineCore):
        return namespace_function(core)

    async def stop(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
        if self._loop is not None:
            await asyncio.to_thread(self._loop.stop)
        if self._host is not None:
            await self._host.close()
        runtime = self.servicer.runtime
        if runtime is not None and runtime.grammars is not None:
            runtime.grammars.close()
