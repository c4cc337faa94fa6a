"""llama.cpp backend: every mode through ``llama-server``, the CPU engine people deploy.

One :class:`LlamaCppEngine` is one ``llama-server`` process for one mode, started on a
free loopback port with that mode's arguments (:func:`server_args`) and stopped by
``close``. Its weights are GGUF files made by llama.cpp's own tools from the
checkpoint folder (:mod:`engine.models.gguf`); its programs are built once from the
source that llama-cpp-python ships on PyPI (:mod:`engine.models.llamacpp_tools`).

Every mode, the reference included, runs through the same server and the same
HTTP streaming client, so what the client costs is in every mode alike and falls out
of each ratio against the reference. How each mode maps onto llama.cpp is declared in
:func:`capabilities`:

* weights: the reference in F32 (or F16, ``checkpoints={"reference": "F16"}``),
  ``int8_quant`` in Q8_0, ``gptq_4bit`` in Q4_K_M and ``awq_4bit`` in Q4_0;
* ``kv_cache_compression``: q8_0 keys and values (``--cache-type-k/-v``);
* ``prefix_caching``: the slot keeps its KV cache and a request reuses the longest
  prefix it shares with it (``cache_prompt``); the other modes process every prompt
  whole. The host-memory prompt cache is off in every mode (``--cache-ram 0``), so
  emptying the slot (:meth:`LlamaCppEngine.reset_prefix_cache`) empties the cache;
* ``chunked_prefill``: the batch and micro-batch sizes (``-b``/``-ub``) set to the
  mode's chunk, so a long prompt is processed in steps shared with other slots' decodes;
* ``continuous_batching``: ``--parallel`` slots with continuous batching; a group's
  requests are sent together;
* speculation: a draft model's GGUF (``-md``), n-gram lookup in the prompt and answer
  (``--spec-type ngram-simple``), or the model's own Q8_0 as its draft (QSpec);
* hybrids as their parts. Graph capture is a CUDA feature, and llama.cpp's Q8_0 dot
  products quantize activations too, so it has no weight-only int8 mode.

Decoding is greedy (temperature 0). Token times are taken as each streamed token
arrives; engine start-up (process start, model load, the server's warm-up) happens in
``load``, outside every request's latency.
"""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

from modeswitch.dataset.errors import InputError
from modeswitch.dataset.requests import Request
from modeswitch.engine.backends.base import BackendCapabilities, ModeSupport, kv_values_per_token
from modeswitch.engine.backends.registry import Backend, register_backend
from modeswitch.engine.models import gguf
from modeswitch.engine.models.llamacpp_tools import build_tools
from modeswitch.engine.modes import ModeConfig, get_mode, list_modes, reference_mode
from modeswitch.engine.results import Generation

NAME = "llamacpp"
#: the GGUF type of each weight format; ``checkpoints`` may name another type or a file
WEIGHTS = {"reference": "F32", "int8": "Q8_0", "gptq_4bit": "Q4_K_M", "awq_4bit": "Q4_0"}
#: QSpec's draft: the model's own weights in this type, by the mode's draft quantization
QSPEC_DRAFT = {"int8": "Q8_0", "int8_weight_only": "Q8_0", "gptq_4bit": "Q4_K_M"}
#: the server's batch and micro-batch sizes outside chunked-prefill modes (llama.cpp's defaults)
BATCH, UBATCH = 2048, 512
DEFAULT_CONTEXT = 4096
#: seconds a server may take to load its model and answer /health
START_TIMEOUT_S = 180.0
#: seconds a streamed request may wait for its next line before it is given up
REQUEST_TIMEOUT_S = 600.0
NO_INT8_WEIGHT_ONLY = ("llama.cpp's Q8_0 matrix products quantize the activations to 8 bits too "
                       "(int8_quant); it has no weight-only int8 path")


def weight_key(mode: ModeConfig) -> str:
    """Which weights a mode runs: ``reference`` or its quantization."""
    return "reference" if mode.quantization == "none" else mode.quantization


def why_not(mode: ModeConfig, draft: bool) -> str | None:
    """Why llama.cpp cannot run ``mode`` (None: it can)."""
    if mode.quantization == "int8_weight_only":
        return NO_INT8_WEIGHT_ONLY
    if mode.graph_capture:
        return "graph capture is a CUDA feature; llama.cpp's CPU backend computes its graph as it is"
    if mode.kv_cache_dtype not in ("auto", "fp8", "int8"):
        return f"no {mode.kv_cache_dtype} KV cache in llama.cpp's server (q8_0 is its 8-bit one)"
    if mode.speculative is not None and mode.speculative.method == "quantized_self" \
            and mode.speculative.draft_quantization not in QSPEC_DRAFT:
        return f"no GGUF type for a {mode.speculative.draft_quantization} draft"
    return mode.missing_draft("DRAFT" if draft else None)


def how(mode: ModeConfig) -> str:
    """One line on how llama.cpp runs ``mode``."""
    parts = [f"{WEIGHTS[weight_key(mode)]} GGUF weights"]
    if mode.kv_cache_dtype != "auto":
        parts.append("q8_0 K/V cache")
    if mode.prefix_caching:
        parts.append("prompt cache (the slot's KV reused, cache_prompt)")
    if mode.chunked_prefill:
        parts.append(f"prefill in chunks of {mode.max_num_batched_tokens or 256} tokens (-b/-ub)")
    if mode.batching == "continuous":
        parts.append(f"{mode.max_num_seqs or 16} parallel slots, continuous batching")
    s = mode.speculative
    if s is not None:
        parts.append({"draft_model": f"draft model GGUF, {s.num_speculative_tokens} drafted",
                      "ngram": f"n-gram lookup (ngram-simple, n={s.prompt_lookup_max}), "
                               f"{s.num_speculative_tokens} drafted",
                      "quantized_self": f"the model's own {QSPEC_DRAFT.get(s.draft_quantization)} as its "
                                        f"draft (QSpec), {s.num_speculative_tokens} drafted"}[s.method])
    return "; ".join(parts) + " (llama-server)"


def capabilities(draft: bool = True, checkpoints: dict | None = None) -> BackendCapabilities:
    """How llama.cpp runs each registered mode on CPU, or why it cannot."""
    support = {}
    for m in list_modes():
        why = why_not(m, draft)
        support[m.name] = ModeSupport(m.name, True, how=how(m)) if why is None else \
            ModeSupport(m.name, False, reason=why)
    return BackendCapabilities(NAME, reference_mode().name,
                               precision((checkpoints or {}).get("reference") or WEIGHTS["reference"]), support)


def precision(weights) -> str:
    """The profile's ``precision`` for weights given as a GGUF type or file: float32 and
    float16 as the other backends write them, a quantized type by its name."""
    name = Path(str(weights)).name
    return {"F32": "float32", "F16": "float16"}.get(name.upper(), name)


def server_args(mode: ModeConfig, model: Path, draft: Path | None, port: int, threads: int | None,
                context: int, slot_dir: Path | None = None) -> list[str]:
    """``llama-server``'s arguments for ``mode`` (its binary first excluded)."""
    slots = (mode.max_num_seqs or 16) if mode.batching == "continuous" else 1
    chunk = (mode.max_num_batched_tokens or 256) if mode.chunked_prefill else None
    args = ["-m", str(model), "--host", "127.0.0.1", "--port", str(port),
            "-c", str(context * slots), "-np", str(slots), "--no-kv-unified",
            "-b", str(chunk or BATCH), "-ub", str(chunk or UBATCH),
            "--flash-attn", "on", "--cache-ram", "0", "--seed", "0", "--no-webui"]
    args += ["-cb"] if slots > 1 else ["-nocb"]
    if threads:
        args += ["-t", str(threads), "-tb", str(threads)]
    if mode.kv_cache_dtype != "auto":
        args += ["--cache-type-k", "q8_0", "--cache-type-v", "q8_0"]
    if mode.prefix_caching and slot_dir is not None:
        args += ["--slot-save-path", str(slot_dir)]  # the slots' erase action needs it
    s = mode.speculative
    if s is not None:
        k = str(s.num_speculative_tokens)
        args += ["--spec-draft-n-max", k, "--spec-draft-n-min", "0"]
        if s.method == "ngram":
            args += ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(s.prompt_lookup_max),
                     "--spec-ngram-simple-size-m", k]
        else:
            if draft is None:
                raise InputError(f"mode {mode.name}: no draft GGUF")
            args += ["--spec-type", "draft-simple", "-md", str(draft)]
            if threads:
                args += ["-td", str(threads), "-tbd", str(threads)]
    return args


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: each byte's printable stand-in in BPE vocabularies."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


class ByteVocab:
    """Token ids by the bytes they stand for, from a byte-level BPE tokenizer.

    llama-server streams a token only once the answer's text is whole UTF-8, so a token
    holding the first bytes of a character reaches the client inside the next token's
    text, without its id. The ids are found again here: the bytes such a token added
    are the text received less the sent token's bytes."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._by_bytes: dict[bytes, int] | None = None
        self._bytes: dict[int, bytes] = {}

    def _table(self) -> dict[bytes, int]:
        if self._by_bytes is None:
            back = {c: b for b, c in bytes_to_unicode().items()}
            table = {}
            for piece, tid in self.tokenizer.get_vocab().items():
                if all(ch in back for ch in piece):
                    raw = bytes(back[ch] for ch in piece)
                    table.setdefault(raw, tid)
                    self._bytes[tid] = raw
            self._by_bytes = table
        return self._by_bytes

    def token_bytes(self, tid: int) -> bytes:
        self._table()
        if tid in self._bytes:
            return self._bytes[tid]
        return self.tokenizer.decode([tid]).encode()

    def split(self, raw: bytes, n: int) -> list[int] | None:
        """``n`` token ids whose bytes make ``raw`` (the first such split), or None."""
        table = self._table()
        if n == 0:
            return [] if not raw else None
        for cut in range(len(raw), 0, -1):
            head = table.get(raw[:cut])
            if head is not None:
                rest = self.split(raw[cut:], n - 1)
                if rest is not None:
                    return [head] + rest
        return None


class LlamaCppEngine:
    """One mode on one ``llama-server`` process."""

    backend = NAME

    def __init__(self, mode: ModeConfig | str, model_path, draft_path=None, threads: int | None = None,
                 checkpoints: dict | None = None, max_context: int | None = None, tools=None):
        self.mode = get_mode(mode) if isinstance(mode, str) else mode
        why = why_not(self.mode, draft=draft_path is not None)
        if why is not None:
            raise InputError(f"mode {self.mode.name} on llama.cpp: {why}")
        self.model_path = Path(model_path)
        self.draft_path = Path(draft_path) if draft_path else None
        self.threads = threads
        self.checkpoints = dict(checkpoints or {})
        self.context = int(max_context or DEFAULT_CONTEXT)
        self.tools = tools
        self.tokenizer = None
        self.info: dict = {"backend": NAME}
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self.ggufs: dict[str, Path] = {}
        self._tmp: tempfile.TemporaryDirectory | None = None
        self._local = threading.local()
        self._vocab: ByteVocab | None = None
        #: the server's own account of each request's last run (prompt tokens taken from
        #: the cache, drafted and accepted tokens, its prefill and decode times), by id
        self.timings: dict[str, dict] = {}

    # ------------------------------------------------------------------ weights
    def _gguf(self, folder: Path, spec: str, log) -> Path:
        """A GGUF path from a type name (made from ``folder`` by llama.cpp's tools) or a file."""
        if spec.endswith(".gguf"):
            path = Path(spec)
            if not path.is_file():
                raise InputError(f"--checkpoint: {path} is not a GGUF file")
            return path
        return gguf.build_gguf(folder, spec.upper(), self.tools, log=log).path

    def _weights(self, log=lambda *a: None) -> tuple[Path, Path | None]:
        """(the mode's model GGUF, its draft GGUF or None), made where missing."""
        key = weight_key(self.mode)
        model = self._gguf(self.model_path, str(self.checkpoints.get(key) or WEIGHTS[key]), log)
        s, draft = self.mode.speculative, None
        if s is not None and s.method == "quantized_self":
            draft = self._gguf(self.model_path, QSPEC_DRAFT[s.draft_quantization], log)
        elif s is not None and s.method == "draft_model":
            folder = Path(s.draft_model) if s.draft_model else self.draft_path
            draft = folder if folder.suffix == ".gguf" else self._gguf(folder, "F32", log)
        self.ggufs = {"model": model, **({"draft": draft} if draft else {})}
        return model, draft

    # ---------------------------------------------------------------- lifecycle
    def load(self) -> LlamaCppEngine:
        from transformers import AutoTokenizer  # lazy: transformers pulls torch

        self.tools = self.tools or build_tools()
        model, draft = self._weights(log=print)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self._vocab = ByteVocab(self.tokenizer)
        self._tmp = tempfile.TemporaryDirectory(prefix="llamacpp-")
        slot_dir = Path(self._tmp.name) / "slots"
        slot_dir.mkdir()
        t0 = time.perf_counter()
        for _ in range(3):  # a port taken between choosing it and binding it: another port
            self.port = free_port()
            args = server_args(self.mode, model, draft, self.port, self.threads, self.context, slot_dir)
            log = open(Path(self._tmp.name) / "server.log", "w")  # noqa: SIM115 - the server writes it
            self.proc = subprocess.Popen([str(self.tools.server), *args], stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)
            log.close()
            if self._wait_ready():
                break
            self._stop()
        else:
            raise RuntimeError(f"llama-server did not start for {self.mode.name}:\n{self.server_log()}")
        key = weight_key(self.mode)
        self.info.update({
            "precision": precision(self.checkpoints.get(key) or WEIGHTS[key]),
            "graph_capture": False, "startup_s": round(time.perf_counter() - t0, 2),
            "gguf": model.name, "llama_cpp": self.tools.version, "threads": self.threads,
            "server_args": " ".join(args[2:]),
        })
        return self

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                status, _ = self._request("GET", "/health", None, timeout=5)
                if status == 200:
                    return True
            except OSError:
                pass
            time.sleep(0.1)
        return False

    def server_log(self, lines: int = 30) -> str:
        if self._tmp is None:
            return ""
        path = Path(self._tmp.name) / "server.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def warmup(self, prompt_tokens: int = 32, new_tokens: int = 4) -> None:
        ids = list(range(5, 5 + prompt_tokens))
        self.run([(Request(id="warmup", prompt_tokens=prompt_tokens, expected_output_tokens=new_tokens), ids)])
        self.reset_prefix_cache()

    def reset_prefix_cache(self) -> None:
        """Empty the slot's cached prompt (a no-op in modes without prefix caching)."""
        if self.mode.prefix_caching and self.proc is not None:
            status, body = self._request("POST", "/slots/0?action=erase", {})
            if status != 200:
                raise RuntimeError(f"llama-server refused to empty its slot: {status} {body[:200]}")

    @property
    def concurrent_runs(self) -> bool:
        """Continuous batching: overlapping ``run`` calls share the server's slots."""
        return self.mode.batching == "continuous"

    def weights_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.ggufs.values() if p.exists())

    @property
    def weights_mb(self) -> float:
        return self.weights_bytes() / 2**20

    @property
    def held_mb(self) -> float:
        """The server process's resident memory now, in MiB (weights, KV cache, buffers)."""
        try:
            return psutil.Process(self.proc.pid).memory_info().rss / 2**20
        except (psutil.NoSuchProcess, AttributeError):
            return self.weights_mb

    @property
    def memory_mb(self) -> float:
        return self.weights_mb + self.cache_mb

    @property
    def cache_mb(self) -> float:
        """The KV cache the server allocates: every slot's context, keys and values over
        every layer, at f16 (or q8_0, about 8.5 bits) per element."""
        elem = 34 / 32 if self.mode.kv_cache_dtype != "auto" else 2
        slots = (self.mode.max_num_seqs or 16) if self.mode.batching == "continuous" else 1
        return kv_values_per_token(self.model_path) * elem * self.context * slots / 2**20

    def _stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
            self.proc = None

    def close(self) -> None:
        self._stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    # ---------------------------------------------------------------- requests
    def _connection(self) -> http.client.HTTPConnection:
        """This thread's kept-alive connection to the server (a new one after a restart)."""
        conn = getattr(self._local, "conn", None)
        if conn is None or getattr(self._local, "port", None) != self.port:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=REQUEST_TIMEOUT_S)
            self._local.conn, self._local.port = conn, self.port
        return conn

    def _request(self, method: str, path: str, body, timeout: float | None = None) -> tuple[int, str]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout or 60)
        try:
            conn.request(method, path, body=None if body is None else json.dumps(body),
                         headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            return resp.status, resp.read().decode(errors="replace")
        finally:
            conn.close()

    def _payload(self, req: Request, ids: list[int], ignore_eos: bool) -> dict:
        return {"prompt": list(ids), "n_predict": int(req.expected_output_tokens), "stream": True,
                "return_tokens": True, "temperature": 0.0, "seed": 0, "ignore_eos": bool(ignore_eos),
                "cache_prompt": bool(self.mode.prefix_caching), "id_slot": -1}

    def _one(self, req: Request, ids: list[int], ignore_eos: bool, t0: float, on_token) -> Generation:
        body = json.dumps(self._payload(req, ids, ignore_eos))
        for attempt in (0, 1):  # a kept-alive connection the server closed: once more on a new one
            conn = self._connection()
            try:
                conn.request("POST", "/completion", body=body, headers={"Content-Type": "application/json"})
                resp = conn.getresponse()
                break
            except (ConnectionError, http.client.HTTPException, OSError):
                conn.close()
                self._local.conn = None
                if attempt:
                    raise RuntimeError(f"llama-server is not answering:\n{self.server_log()}") from None
        if resp.status != 200:
            raise RuntimeError(f"llama-server answered {resp.status}: {resp.read()[:300]!r}")
        out, times = [], []
        try:
            self._read_stream(req, resp, t0, out, times, on_token)
        except BaseException:
            # the caller stopped listening (a client gone, a stop sequence met) or the stream
            # broke: closing the connection makes llama-server cancel the request, and the
            # half-read response is never reused
            conn.close()
            self._local.conn = None
            raise
        latency = (time.perf_counter() - t0) * 1000
        return Generation(req.id, out, self.tokenizer.decode(out, skip_special_tokens=True), latency, times)

    def _read_stream(self, req: Request, resp, t0: float, out: list, times: list, on_token) -> None:
        """Read ``req``'s streamed tokens into ``out`` and their arrival times into ``times``."""
        while True:
            line = resp.readline()
            if not line:
                break
            if not line.startswith(b"data: "):
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(f"llama-server: {chunk['error']}")
            now = (time.perf_counter() - t0) * 1000
            new = self._new_ids(chunk, out)
            if new:
                out.extend(new)
                times.extend([now] * len(new))
                if on_token is not None:
                    on_token(req.id, new)
            if chunk.get("stop"):
                self.timings[req.id] = chunk.get("timings") or {}
                break
        resp.read()

    def _new_ids(self, chunk: dict, so_far: list[int]) -> list[int]:
        """The token ids a streamed chunk adds, with any the server held back before it
        (the first bytes of a character, :class:`ByteVocab`) found again."""
        sent = [int(t) for t in chunk.get("tokens") or []]
        made = int(chunk.get("tokens_predicted") or 0)
        missing = made - len(so_far) - len(sent)
        if not sent or missing <= 0:
            return sent
        raw = chunk.get("content", "").encode()
        tail = b"".join(self._vocab.token_bytes(t) for t in sent)
        found = self._vocab.split(raw[:len(raw) - len(tail)], missing) if raw.endswith(tail) else None
        if found is None:
            raise RuntimeError(f"llama-server held back {missing} token(s) whose ids could not be "
                               f"found again from the text {raw!r}")
        return found + sent

    def run(self, group: list[tuple[Request, list[int]]], ignore_eos: bool = True,
            on_token=None) -> list[Generation]:
        """Serve requests that arrive together; latencies count from their arrival.
        Continuous batching sends them at once (the server batches them in its slots);
        other modes one after another."""
        t0 = time.perf_counter()
        if self.mode.batching == "continuous" and len(group) > 1:
            with ThreadPoolExecutor(max_workers=len(group)) as pool:
                futures = [pool.submit(self._one, r, ids, ignore_eos, t0, on_token) for r, ids in group]
                return [f.result() for f in futures]
        return [self._one(r, ids, ignore_eos, t0, on_token) for r, ids in group]


def _engine(mode, settings) -> LlamaCppEngine:
    if settings.device != "cpu":
        raise InputError(f"the llama.cpp backend runs on the CPU here (device {settings.device!r}); "
                         "use the vllm backend on GPUs")
    return LlamaCppEngine(mode, settings.model_path, settings.draft_path, threads=settings.threads,
                          checkpoints=settings.checkpoints, max_context=settings.max_context)


register_backend(Backend(NAME, "llama.cpp's llama-server on CPU (GGUF: F32, Q8_0, Q4_K_M, Q4_0)",
                         capabilities=lambda s: capabilities(s.draft_path is not None, s.checkpoints),
                         engine=_engine, child_processes=True))
