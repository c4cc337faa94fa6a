"""The transformers/PyTorch backend: every registered mode it can run, for real.

One :class:`TransformersEngine` serves one mode of one model. How each mode is
implemented (and why the others are not) is declared in :func:`capabilities`,
the single place the profiler, routers and tests read it from.

Decoding is greedy everywhere so that lossless modes must reproduce the
reference output token for token.
"""

from __future__ import annotations

import asyncio
import copy
import gc
import inspect
import itertools
import logging
import queue
import threading
import time
from pathlib import Path

from modeswitch.dataset.errors import InputError
from modeswitch.dataset.requests import Request
from modeswitch.engine.backends.base import BackendCapabilities, ModeSupport
from modeswitch.engine.backends.registry import Backend, register_backend
from modeswitch.engine.memory import held_bytes, module_bytes
from modeswitch.engine.modes import ModeConfig, get_mode, reference_mode
from modeswitch.engine.results import Generation

NAME = "transformers"


def capabilities(device: str = "cpu") -> BackendCapabilities:
    """How this backend implements each mode on ``device``, or why it cannot."""
    cpu = device == "cpu"
    int8 = "dynamic int8 linear layers (torch.ao quantize_dynamic, fbgemm)"
    int4 = ("4-bit weight-only RTN, symmetric, group 128 (64 or 32 where a layer's width needs it), "
            "aten _weight_int4pack_mm_for_cpu with bf16 activations (CPU analogue of GPTQ; no calibration)")
    no_quant_gpu = "weight quantization on CUDA needs pre-quantized checkpoints: use the vLLM backend"
    modes: dict[str, ModeSupport] = {}

    def yes(name, how):
        modes[name] = ModeSupport(name, True, how=how)

    def no(name, reason):
        modes[name] = ModeSupport(name, False, reason=reason)

    def cpu_only(name, how):
        yes(name, how) if cpu else no(name, no_quant_gpu)

    ref = reference_mode().name
    yes(ref, "unquantized weights in the device's native precision (fp32 on CPU, "
                         "fp16 on CUDA)")
    cpu_only("int8_quant", int8)
    cpu_only("int8_weight_only", "int8 weights per output channel, bf16 activations (aten "
             "_weight_int8pack_mm; its fp32-activation path is 19x slower)")
    cpu_only("gptq_4bit", int4)
    no("awq_4bit", "no activation-aware 4-bit path in this backend; gptq_4bit is its only 4-bit "
                   "mode (routers map awq_4bit to it)")
    yes("speculative_decoding", "assisted generation with the draft model, k tokens per step")
    yes("ngram_speculative_decoding", "prompt-lookup decoding (n-grams of the prompt)")
    cpu_only("quantized_draft_speculative", "assisted generation with a weight-only int8 copy of the "
             "model as its own draft (aten _weight_int8pack_mm), the model verifying: QSpec")
    yes("kv_cache_compression", "fp8 (e4m3) quantized KV cache, per-tensor scale (transformers "
                                "QuantizedCache backend 'fp8')")
    yes("prefix_caching", "KV cache of the shared prefix kept in an LRU store (byte budget), "
                          "copied into each request that starts with it")
    yes("chunked_prefill", "prompt prefilled in chunks of max_num_batched_tokens into the KV "
                           "cache, then decoded")
    yes("continuous_batching", "transformers' continuous-batching manager (paged KV cache; "
                               "requests join the running batch every step)")
    no("cuda_graphs", "not built: static cache + torch.compile recompiles for every new prompt "
                      "length on CPU (a trial run noted 16-54 s per compile and no gain over eager)")
    cpu_only("gptq_plus_prefix_caching", int4 + " + prefix store")
    cpu_only("int8_plus_prefix_caching", int8 + " + prefix store")
    cpu_only("int8_plus_continuous_batching", int8 + " + continuous-batching manager")
    no("gptq_plus_continuous_batching", "not built: the int4 linear layer was not validated "
                                        "inside the continuous-batching manager")
    no("awq_plus_chunked_prefill", "no activation-aware 4-bit path (see awq_4bit)")
    cpu_only("gptq_plus_chunked_prefill", int4 + " + chunked prefill")
    cpu_only("int8_plus_chunked_prefill", int8 + " + chunked prefill")
    no("speculative_plus_chunked_prefill", "not built: prefilling the target's cache in chunks "
                                           "before assisted generation was not implemented")
    return BackendCapabilities(NAME, ref, "float32" if cpu else "float16", modes)


def quiet_transformers():
    import transformers  # lazy: transformers pulls torch

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    logging.getLogger("transformers").setLevel(logging.ERROR)


class TransformersEngine:
    """One mode of one model on transformers. ``load`` builds it, ``run`` serves a
    group of requests that arrive together, ``close`` frees it."""

    backend = NAME

    def __init__(self, mode: ModeConfig | str, model_path, draft_path=None, device: str = "cpu",
                 prefix_cache_mb: int = 256, threads: int | None = None, max_context: int | None = None):
        self.mode = get_mode(mode) if isinstance(mode, str) else mode
        self.model_path = Path(model_path)
        self.draft_path = Path(draft_path) if draft_path else None
        self.device = device
        self.prefix_cache_mb = prefix_cache_mb
        self.threads = threads
        self.max_context = max_context
        self.model = self.draft = self.tokenizer = self.prefix_store = self._cb = None
        self.info: dict = {}
        self._weights_mb = None
        self._waiters: dict = {}  # continuous batching: request id -> where its run() takes results
        self._waiters_lock = threading.Lock()
        self._dispatcher = None
        self._serial = itertools.count()

    @property
    def concurrent_runs(self) -> bool:
        """True when several ``run`` calls may overlap and share the engine's batch
        (the continuous-batching manager); other modes serve one call at a time."""
        return self._cb is not None

    # ----------------------------------------------------------------- set-up
    #: longest context the continuous-batching cache is sized for (a long-context
    #: checkpoint's own limit, 128k for Llama-3.1, would size it for nothing we send)
    CB_MAX_CONTEXT = 8192
    #: tokens one continuous-batching step may process. Left to transformers, it is
    #: sized from free memory, and on CPU each step builds a float32 attention mask of
    #: (batch tokens x every cached token): 32 concurrent requests on the tiny model took
    #: the process from 0.4 to 3.4 GB. Measured, one run each (32 requests x 3 rounds,
    #: int8 + continuous batching): default 3,433 MB RSS, 9.6 s; 2,048: 1,570 MB, 6.7 s;
    #: 512: 1,133 MB, 6.4 s. Longer prefills are split across steps.
    CB_MAX_BATCH_TOKENS = 1024

    def _cb_config(self):
        """The continuous-batching manager's paged KV cache, sized for ``max_num_seqs``
        requests of the longest context we serve, sharing blocks between requests only in
        a prefix-caching mode. Left to itself, transformers sizes it
        from free memory, on CPU 60 % of the machine's RAM per engine, so two such
        engines in one process (``profile --interleave``, the server) exhaust the
        machine as their pages are touched (an interleaved profile of every mode is
        then killed by the OOM killer)."""
        from transformers import ContinuousBatchingConfig  # lazy: transformers pulls torch

        page = 256
        seqs = self.mode.max_num_seqs or 16
        ctx = self._context()
        # transformers shares KV blocks between requests with a common prefix by default:
        # prefix caching inside continuous batching. That is a mode of its own here, so
        # a batching mode shares blocks only if it is also a prefix-caching mode (measured
        # with sharing on, a 991-token prompt's TTFT was 153 ms on its first run and 36-42 ms
        # on the repeats, so repeated trials measured the cache, not the batching)
        return ContinuousBatchingConfig(page_size=page, num_blocks=-(-seqs * ctx // page) + seqs,
                                        max_batch_tokens=self.CB_MAX_BATCH_TOKENS,
                                        allow_block_sharing=bool(self.mode.prefix_caching))

    def _context(self) -> int:
        """The longest sequence the caches are sized for: the model's limit, the caller's
        budget (``max_context``: a profile's or a live check's longest request) or
        ``CB_MAX_CONTEXT``, whichever is smallest."""
        limit = int(getattr(self.model.config, "max_position_embeddings", 4096) or 4096)
        return min(limit, int(self.max_context or self.CB_MAX_CONTEXT), self.CB_MAX_CONTEXT)

    def load(self) -> TransformersEngine:
        import torch  # lazy: torch is heavy

        # lazy: transformers pulls torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from modeswitch.engine.backends import quantize  # lazy: pulls torch

        support = capabilities(self.device).support(self.mode.name)
        if not support.supported:
            raise NotImplementedError(f"{NAME} cannot run {self.mode.name}: {support.reason}")
        quiet_transformers()
        if self.threads:
            torch.set_num_threads(self.threads)
        dtype = torch.float32 if self.device == "cpu" else torch.float16
        self.dtype = dtype
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=dtype).to(self.device).eval()
        m = self.mode
        if m.quantization == "int8":
            self.info["int8_linears"] = quantize.quantize_int8_dynamic(self.model)
        elif m.quantization == "int8_weight_only":
            self.info["int8_weight_only_linears"] = quantize.quantize_int8_weight_only(self.model)
        elif m.quantization in ("gptq_4bit", "awq_4bit"):
            self.info["int4_linears"] = quantize.quantize_int4_weight_only(self.model)
        if m.speculative is not None and m.speculative.method == "quantized_self":
            self.draft = self._quantized_copy(m.speculative.draft_quantization)
        if m.speculative is not None and m.speculative.method == "draft_model":
            draft = m.speculative.draft_model or self.draft_path
            if draft is None:
                raise InputError(f"{m.name} needs a draft model (--draft-model PATH)")
            self.draft = AutoModelForCausalLM.from_pretrained(draft, dtype=dtype).to(self.device).eval()
        if self.draft is not None:
            gc = self.draft.generation_config
            gc.num_assistant_tokens = m.speculative.num_speculative_tokens
            gc.num_assistant_tokens_schedule = "constant"
            gc.assistant_confidence_threshold = 0.0
        if m.prefix_caching:
            from modeswitch.engine.backends.prefix_cache import PrefixKVStore  # lazy: pulls torch

            self.prefix_store = PrefixKVStore(self.prefix_cache_mb * 2**20)
        if m.batching == "continuous":
            from transformers import GenerationConfig  # lazy: transformers pulls torch

            gc = GenerationConfig(do_sample=False, max_new_tokens=64,
                                  eos_token_id=self.tokenizer.eos_token_id,
                                  pad_token_id=self.tokenizer.pad_token_id)
            if self.device == "cpu":
                machine_memory_for_paged_cache()
            self._cb = self.model.init_continuous_batching(
                generation_config=gc, continuous_batching_config=self._cb_config())
            self._cb.start()
            self._dispatcher = threading.Thread(target=self._dispatch, args=(self._cb,),
                                                name=f"cb-results-{m.name}", daemon=True)
            self._dispatcher.start()
        self.info["precision"] = str(dtype).replace("torch.", "")
        # newer transformers renamed past_key_values to cache
        self._cache_kw = ("cache" if "cache" in inspect.signature(self.model.forward).parameters
                          else "past_key_values")
        return self

    @property
    def weights_mb(self) -> float:
        """Resident weights in MiB, measured once after loading."""
        if self._weights_mb is None:
            self._weights_mb = self.weights_bytes() / 2**20
        return self._weights_mb

    @property
    def memory_mb(self) -> float:
        """What the engine holds once its caches fill: weights plus the KV cache it
        reserves, so a server's ``--memory-budget-mb`` counts what the pages will take,
        not the weights alone (the continuous-batching cache is most of it)."""
        return self.weights_mb + self.cache_mb

    @property
    def cache_mb(self) -> float:
        """The KV cache this engine can fill, in MiB: the continuous-batching manager's
        paged cache (``_cb_config``'s blocks) and, on CPU, its step's attention mask; the
        prefix store's budget; else one request's cache at the longest context it serves."""
        conf = self.model.config
        layers = int(getattr(conf, "num_hidden_layers", 0) or 0)
        heads = int(getattr(conf, "num_attention_heads", 0) or 0)
        kv_heads = int(getattr(conf, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(conf, "head_dim", None) or (conf.hidden_size // max(heads, 1)))
        elem = 4 if str(getattr(self, "dtype", "float32")).endswith("float32") else 2
        per_token = 2 * layers * kv_heads * head_dim * elem  # keys and values
        ctx = self._context()
        if self._cb is not None:
            cfg = self._cb_config()
            tokens = cfg.num_blocks * cfg.page_size
            # and each step's float32 attention mask over every cached token (CPU)
            mask_mb = cfg.max_batch_tokens * tokens * 4 / 2**20 if self.device == "cpu" else 0.0
        else:
            tokens, mask_mb = ctx, 0.0
        mb = tokens * per_token / 2**20 + mask_mb
        if self.prefix_store is not None:
            mb += self.prefix_cache_mb
        return mb

    def _quantized_copy(self, how: str):
        """The model's own weights quantised, as its draft (the copy shares no tensors)."""
        from modeswitch.engine.backends import quantize  # lazy: pulls torch

        draft = copy.deepcopy(self.model)
        if how == "int8":
            quantize.quantize_int8_dynamic(draft)
        elif how == "int8_weight_only":
            quantize.quantize_int8_weight_only(draft)
        else:
            quantize.quantize_int4_weight_only(draft)
        draft.generation_config = copy.deepcopy(self.model.generation_config)
        return draft.eval()

    def weights_bytes(self) -> int:
        return module_bytes(self.model, self.draft)

    @property
    def held_mb(self) -> float:
        """Every tensor this engine holds now, in MiB: weights, draft, continuous
        batching's paged cache and step buffers, the prefix store's entries
        (``modeswitch.engine.memory.held_bytes``; the profiler's memory base on CPU)."""
        return held_bytes(self) / 2**20

    def warmup(self, prompt_tokens: int = 64, new_tokens: int = 8) -> None:
        ids = list(range(5, 5 + prompt_tokens))
        req = Request(id="warmup", prompt_tokens=prompt_tokens, expected_output_tokens=new_tokens)
        self.run([(req, ids)], ignore_eos=True)
        if self.prefix_store is not None:
            self.prefix_store = type(self.prefix_store)(self.prefix_store.max_bytes)

    def close(self) -> None:
        if self._cb is not None:
            cb, self._cb = self._cb, None
            cb.stop(block=True)
            self._dispatcher.join(timeout=10)
            self._fail_waiters("the engine was closed")
        self.model = self.draft = None
        gc.collect()

    # ---------------------------------------------------------------- serving
    def run(self, group: list[tuple[Request, list[int]]], ignore_eos: bool = True,
            on_token=None) -> list[Generation]:
        """Serve requests that arrive together; latencies count from their arrival.

        ``on_token(request_id, ids)`` is called as tokens arrive. Continuous
        batching: calls from several threads may overlap and share the batch
        (``concurrent_runs``).
        """
        if self._cb is not None:
            return self._run_continuous(group, ignore_eos, on_token)
        t0 = time.perf_counter()
        return [self._generate_one(req, ids, ignore_eos, t0, on_token) for req, ids in group]

    def reset_prefix_cache(self) -> None:
        """Empty the prefix cache (a no-op in modes without one)."""
        if self.prefix_store is not None:
            self.prefix_store.clear()

    def _generate_one(self, req: Request, ids: list[int], ignore_eos: bool, t0: float,
                      on_token=None) -> Generation:
        import torch  # lazy: torch is heavy
        from transformers import DynamicCache, QuantizedCache  # lazy: transformers pulls torch

        from modeswitch.engine.timing import TokenTimer  # lazy: pulls transformers

        m = self.mode
        timer = TokenTimer(start=t0, on_token=None if on_token is None else
                           (lambda new, rid=req.id: on_token(rid, new)))
        max_new = req.expected_output_tokens
        kwargs = dict(max_new_tokens=max_new, do_sample=False, streamer=timer,
                      pad_token_id=self.tokenizer.pad_token_id)
        if ignore_eos:
            kwargs["min_new_tokens"] = max_new
        if m.speculative is not None:
            if m.speculative.method in ("draft_model", "quantized_self"):
                kwargs["assistant_model"] = self.draft
            else:
                kwargs["prompt_lookup_num_tokens"] = m.speculative.num_speculative_tokens
                kwargs["max_matching_ngram_size"] = m.speculative.prompt_lookup_max
        input_ids = torch.tensor([ids], device=self.device)
        cache = None
        with torch.inference_mode():
            if m.kv_cache_dtype == "fp8":
                cache = QuantizedCache(backend="fp8", config=self.model.config)
            if self.prefix_store is not None:
                n, cached = self.prefix_store.lookup(ids)
                p = req.shared_prefix_tokens if 0 < req.shared_prefix_tokens < len(ids) else 0
                if cached is not None:
                    cache = cached
                    self.info["prefix_hits"] = self.info.get("prefix_hits", 0) + 1
                    self.info["prefix_tokens_reused"] = self.info.get("prefix_tokens_reused", 0) + n
                    if n < p:
                        # a shorter entry (another request's prefix: a chat template's opening
                        # tokens) is only a start: extend it to this request's shared prefix
                        # and keep that too, or the short entry would stand in for every
                        # longer prefix that shares its opening, and none would be kept
                        self.model(input_ids[:, n:p], use_cache=True, **{self._cache_kw: cache})
                        self.prefix_store.store(ids[:p], cache)
                elif p:
                    cache = DynamicCache(config=self.model.config)
                    self.model(input_ids[:, :p], use_cache=True, **{self._cache_kw: cache})
                    self.prefix_store.store(ids[:p], cache)
            if m.chunked_prefill:
                cache = cache if cache is not None else DynamicCache(config=self.model.config)
                chunk = m.max_num_batched_tokens or 256
                done = cache.get_seq_length()
                for s in range(done, len(ids) - 1, chunk):
                    e = min(s + chunk, len(ids) - 1)
                    self.model(input_ids[:, s:e], use_cache=True, **{self._cache_kw: cache})
                self.info["prefill_chunks"] = self.info.get("prefill_chunks", 0) + max(
                    0, -(-(len(ids) - 1 - done) // chunk))
            if cache is not None:
                kwargs[self._cache_kw] = cache
            out = self.model.generate(input_ids, attention_mask=torch.ones_like(input_ids), **kwargs)
        latency = (time.perf_counter() - t0) * 1000
        new = out[0, len(ids):].tolist()
        return Generation(req.id, new, self.tokenizer.decode(new, skip_special_tokens=True), latency,
                          timer.times_ms[: len(new)])

    # --------------------------------------------------- continuous batching
    def _dispatch(self, cb) -> None:
        """Route the manager's results to the ``run`` calls waiting for them, so calls
        from several threads (concurrent HTTP requests) share one running batch."""
        while self._cb is cb:
            res = cb.get_result(timeout=0.2)
            if res is None:
                if self._cb is cb and not cb.is_running():
                    self._fail_waiters("the continuous-batching manager stopped")
                    time.sleep(0.2)
                continue
            with self._waiters_lock:
                deliver = self._waiters.get(res.request_id)
            if deliver is not None:
                try:
                    deliver(res)
                except RuntimeError:  # its caller's event loop is gone: nobody waits for it
                    pass

    def _fail_waiters(self, why: str) -> None:
        with self._waiters_lock:
            waiting, self._waiters = self._waiters, {}
        for rid, deliver in waiting.items():
            try:
                deliver(RuntimeError(f"continuous batching: {why} before request {rid} finished"))
            except RuntimeError:  # its caller's event loop is gone
                pass

    def _run_continuous(self, group, ignore_eos: bool, on_token=None) -> list[Generation]:
        """Add the group's requests to the running batch and wait for them (this thread
        blocks); requests of other concurrent calls join the same batch."""
        call = _BatchCall(self, group, ignore_eos, on_token)
        results: queue.Queue = queue.Queue()
        try:
            call.start(results.put)
            while not call.finished:
                try:  # a long batch may take minutes; a stopped manager fails its waiters
                    res = results.get(timeout=5)
                except queue.Empty:
                    call.check_running()
                    continue
                call.take(res)
        finally:
            call.end()
        return call.generations()

    async def arun(self, group: list[tuple[Request, list[int]]], ignore_eos: bool = True,
                   on_token=None) -> list[Generation]:
        """``run`` awaited on the caller's event loop. Continuous batching holds no thread:
        the manager's results reach the loop through ``call_soon_threadsafe``, and
        cancelling the caller takes its requests out of the batch. Other modes generate
        in the calling thread's stead in a worker thread (one per engine at a time: the
        server serialises them)."""
        if self._cb is None:
            return await asyncio.to_thread(self.run, group, ignore_eos, on_token)
        loop = asyncio.get_running_loop()
        results: asyncio.Queue = asyncio.Queue()
        call = _BatchCall(self, group, ignore_eos, on_token)
        try:
            call.start(lambda res: loop.call_soon_threadsafe(results.put_nowait, res))
            while not call.finished:
                try:
                    res = await asyncio.wait_for(results.get(), timeout=5)
                except TimeoutError:
                    call.check_running()
                    continue
                call.take(res)
        finally:
            call.end()
        return call.generations()


def machine_memory_for_paged_cache() -> None:
    """Let transformers' paged KV cache check its footprint against the memory the
    machine has free, not against one NUMA node's size.

    Why: transformers (5.24 on) caps the memory it believes a CPU process may use at the
    total of the NUMA nodes its cpuset allows, less the process's resident size. Some
    sandboxes and containers report one node far smaller than the memory the process
    can use (one node reads a third of the machine's memory, all of which is usable), so
    an interleaved profile holding a dozen engines is refused its cache with "more than
    available memory". The cache's size is ours
    (:meth:`TransformersEngine._cb_config` fixes its blocks and batch tokens); the check
    that remains should ask the kernel what is free (``psutil.virtual_memory``). Wraps
    the module's function once; other devices are left as transformers reads them."""
    import psutil  # lazy: only engines with continuous batching on CPU need it
    from transformers.generation.continuous_batching import cache  # lazy: transformers pulls torch

    read = cache.get_device_and_memory_breakdown
    if getattr(read, "machine_memory", False):
        return

    def breakdown():
        device, total, reserved, allocated = read()
        if device.type == "cpu":
            used = max(reserved, allocated)
            total = max(total, used + psutil.virtual_memory().available)
        return device, total, reserved, allocated

    breakdown.machine_memory = True
    cache.get_device_and_memory_breakdown = breakdown


class _BatchCall:
    """One ``run``/``arun`` call's requests in the continuous-batching manager's running
    batch: registered with the engine's result dispatcher (``deliver`` gets each of their
    results, or the exception that ended the manager), added to the batch, their results
    taken in as they come (new tokens passed to ``on_token``: the requests stream when it
    is given), and on the way out unregistered, with whatever has not finished cancelled
    (the caller left early: its token callback raised, its task was cancelled)."""

    def __init__(self, engine: TransformersEngine, group, ignore_eos: bool, on_token=None):
        self.engine, self.group, self.on_token = engine, group, on_token
        self.t0 = time.perf_counter()
        self.eos = -1 if ignore_eos else engine.tokenizer.eos_token_id
        # a request may run more than once: each run gets its own id in the batch
        self.rids: dict[str, Request] = {f"{req.id}#{next(engine._serial)}": req for req, _ in group}
        self.seen = dict.fromkeys(self.rids, 0)
        self.done: dict[str, Generation] = {}

    @property
    def finished(self) -> bool:
        return len(self.done) == len(self.rids)

    def start(self, deliver) -> None:
        eng = self.engine
        with eng._waiters_lock:
            eng._waiters.update(dict.fromkeys(self.rids, deliver))
            eng.info["max_requests_in_batch"] = max(eng.info.get("max_requests_in_batch", 0),
                                                    len(eng._waiters))
        for (req, ids), rid in zip(self.group, self.rids):
            eng._cb.add_request(list(ids), request_id=rid, max_new_tokens=req.expected_output_tokens,
                                streaming=self.on_token is not None, record_timestamps=True,
                                eos_token_id=self.eos)

    def check_running(self) -> None:
        cb = self.engine._cb
        if cb is None or not cb.is_running():
            raise RuntimeError("continuous batching stopped before the requests finished")

    def take(self, res) -> None:
        if isinstance(res, Exception):
            raise res
        if res.error:
            raise RuntimeError(f"continuous batching failed: {res.error}")
        rid = res.request_id
        toks = list(res.generated_tokens)
        if self.on_token is not None and len(toks) > self.seen[rid]:
            self.on_token(self.rids[rid].id, toks[self.seen[rid]:])
            self.seen[rid] = len(toks)
        if not res.is_finished():
            return
        now = time.perf_counter()
        times = [(t - self.t0) * 1000 for t in (res.timestamps or [])][: len(toks)]
        self.done[rid] = Generation(self.rids[rid].id, toks,
                                    self.engine.tokenizer.decode(toks, skip_special_tokens=True),
                                    (now - self.t0) * 1000, times)

    def end(self) -> None:
        eng = self.engine
        with eng._waiters_lock:
            for rid in self.rids:
                eng._waiters.pop(rid, None)
        for rid in self.rids:
            if rid not in self.done and eng._cb is not None:
                try:
                    eng._cb.cancel_request(rid)
                except Exception:  # noqa: BLE001 - finished or already gone
                    pass

    def generations(self) -> list[Generation]:
        return [self.done[rid] for rid in self.rids]


def _set_torch_threads(n: int) -> None:
    import torch  # lazy: torch is heavy

    torch.set_num_threads(int(n))


register_backend(Backend(NAME, "Hugging Face transformers on PyTorch (any CPU; CUDA)",
                         capabilities=lambda s: capabilities(s.device),
                         engine=lambda mode, s: TransformersEngine(mode, s.model_path, s.draft_path, s.device,
                                                                  threads=s.threads, max_context=s.max_context),
                         set_threads=_set_torch_threads))
