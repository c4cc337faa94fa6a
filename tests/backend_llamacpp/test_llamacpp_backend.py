"""The llama.cpp backend for real: GGUF files made by llama.cpp's own tools from the test
model, every mode it runs through llama-server, and the server with a router in front
answering the ``openai`` client.

They need llama.cpp's programs, built once from llama-cpp-python's source package
(``make test-llamacpp`` builds them and runs these; a few minutes the first time). Where
they are not built these tests are skipped, unless ``$MODESWITCH_REQUIRE_LLAMACPP`` is
set (``make test-llamacpp`` sets it): then a missing build fails.
"""

import os

import pytest

from modeswitch.dataset.requests import Request
from modeswitch.dataset.workloads import get_workload
from modeswitch.engine.backends.llamacpp_backend import LlamaCppEngine
from modeswitch.engine.models import gguf
from modeswitch.engine.models.llamacpp_tools import find_tools

LOSSLESS = ("prefix_caching", "chunked_prefill", "continuous_batching", "ngram_speculative_decoding",
            "speculative_decoding", "quantized_draft_speculative")
LOSSY = ("int8_quant", "gptq_4bit", "awq_4bit", "kv_cache_compression")


@pytest.fixture(scope="session")
def tools():
    found = find_tools()
    if found is None:
        if os.environ.get("MODESWITCH_REQUIRE_LLAMACPP"):
            pytest.fail("llama.cpp is not built: `make test-llamacpp` builds it")
        pytest.skip("llama.cpp is not built here (`make test-llamacpp` builds it and runs these)")
    return found


@pytest.fixture(scope="session")
def ggufs(tools, tiny_models):
    made = gguf.build_ggufs(tiny_models.target, gguf.TYPES, tools, log=lambda *a: None)
    made["draft"] = gguf.build_gguf(tiny_models.draft, "F32", tools, log=lambda *a: None)
    return made


@pytest.fixture(scope="session")
def outputs(tools, ggufs, tiny_models):
    """Every mode's generations on the same requests, one server at a time."""
    from transformers import AutoTokenizer

    from modeswitch.engine.prompts import PromptBuilder

    builder = PromptBuilder(AutoTokenizer.from_pretrained(tiny_models.target))
    reqs = [Request(id=r.id, prompt_tokens=min(r.prompt_tokens, 96), expected_output_tokens=24, family=r.family)
            for r in get_workload("short_prompt_long_output").sample(2, seed=1)]
    shared = [Request(id=r.id, prompt_tokens=200, shared_prefix_tokens=160, expected_output_tokens=8,
                      family=r.family) for r in get_workload("shared_prefix_chat").sample(2, seed=2)]
    group = [Request(id=f"b{i}", prompt_tokens=64, expected_output_tokens=16, concurrent_requests=4,
                     family="batch_pressure") for i in range(4)]
    p_reqs, p_shared, p_group = ([builder.prepare(r) for r in rs] for rs in (reqs, shared, group))
    out = {}
    for mode in ("fp16_baseline",) + LOSSLESS + LOSSY:
        eng = LlamaCppEngine(mode, tiny_models.target, tiny_models.draft, threads=1, max_context=512,
                             tools=tools).load()
        try:
            eng.warmup()
            streamed = []
            single = eng.run(p_reqs, on_token=lambda rid, ids, acc=streamed: acc.append((rid, list(ids))))
            eng.reset_prefix_cache()
            eng.run(p_shared[:1])  # the prefix, primed
            follow = eng.run(p_shared[1:])
            out[mode] = {"single": single, "follow": follow, "batch": eng.run(p_group), "streamed": streamed,
                         "timings": dict(eng.timings), "info": dict(eng.info), "weights_mb": eng.weights_mb,
                         "held_mb": eng.held_mb, "ids": [ids for _, ids in p_shared]}
        finally:
            eng.close()
            assert eng.proc is None
    return out


def test_llamacpp_tools_make_every_gguf_type_with_a_card(ggufs):
    for name, g in ggufs.items():
        card = g.card
        assert g.path.stat().st_size == card["size_bytes"] > 0 and len(card["sha256"]) == 64, name
        assert card["tool"].startswith("llama.cpp") and card["tool_version"]
    assert ggufs["Q8_0"].card["source"]["gguf_sha256"] == ggufs["F32"].card["sha256"]
    assert ggufs["Q8_0"].card["size_bytes"] < ggufs["F16"].card["size_bytes"] < ggufs["F32"].card["size_bytes"]


def test_every_mode_generates_every_token_with_its_time(outputs):
    for mode, o in outputs.items():
        for g in o["single"]:
            assert g.output_tokens == 24 and len(g.token_times_ms) == 24, mode
            assert 0 < g.ttft_ms <= g.token_times_ms[-1] <= g.latency_ms, mode
            assert g.text.strip(), mode
        streamed = [i for rid, ids in o["streamed"] if rid == o["single"][0].request_id for i in ids]
        assert streamed == o["single"][0].output_ids, mode
        assert [g.output_tokens for g in o["batch"]] == [16] * 4, mode
        assert o["info"]["startup_s"] > 0 and o["weights_mb"] > 0 and o["held_mb"] > 0


def test_lossless_modes_reproduce_the_references_greedy_tokens(outputs):
    ref = outputs["fp16_baseline"]
    for mode in LOSSLESS:
        o = outputs[mode]
        assert [g.output_ids for g in o["single"]] == [g.output_ids for g in ref["single"]], mode
        assert [g.output_ids for g in o["follow"]] == [g.output_ids for g in ref["follow"]], mode


def test_each_mode_runs_its_own_weights_and_mechanism(outputs):
    assert outputs["fp16_baseline"]["info"]["precision"] == "float32"
    assert outputs["int8_quant"]["info"]["precision"] == "Q8_0"
    assert outputs["gptq_4bit"]["info"]["precision"] == "Q4_K_M"
    assert outputs["awq_4bit"]["info"]["precision"] == "Q4_0"
    assert outputs["int8_quant"]["weights_mb"] < outputs["fp16_baseline"]["weights_mb"] / 3
    # the prefix cache: the follow-up request took its shared prefix from the slot
    follow_id = outputs["prefix_caching"]["follow"][0].request_id
    assert outputs["prefix_caching"]["timings"][follow_id]["cache_n"] >= 150
    assert outputs["fp16_baseline"]["timings"][follow_id]["cache_n"] == 0
    # speculation drafted tokens and the target accepted some of them
    for mode in ("speculative_decoding", "quantized_draft_speculative"):
        drafted = sum(t.get("draft_n", 0) for t in outputs[mode]["timings"].values())
        accepted = sum(t.get("draft_n_accepted", 0) for t in outputs[mode]["timings"].values())
        assert drafted > 0 and 0 < accepted <= drafted, mode


def test_the_server_routes_to_llamacpp_engines_and_answers_the_openai_client(tools, ggufs, tiny_models):
    import openai

    from modeswitch.engine.serving import ServerConfig, create_app
    from tests.helpers import start

    class Router:
        mode = "int8_quant"

        def route(self, request):
            return self.mode

    router = Router()
    cfg = ServerConfig(model_path=str(tiny_models.target), draft_path=str(tiny_models.draft),
                       backend="llamacpp", max_tokens_limit=32)
    app = create_app(lambda: router, cfg, supported_modes=["fp16_baseline", "int8_quant", "prefix_caching"])
    srv, th, port = start(app)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        answers = {}
        for mode in ("int8_quant", "fp16_baseline"):
            router.mode = mode
            r = client.chat.completions.create(model="modeswitch", max_tokens=12, temperature=0,
                                               messages=[{"role": "user", "content": "def add(a, b):"}])
            assert r.choices[0].message.content and r.usage.completion_tokens <= 12
            answers[mode] = r
        chunks = list(client.chat.completions.create(model="modeswitch", max_tokens=8, stream=True,
                                                     messages=[{"role": "user", "content": "import os"}]))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finally:
        srv.should_exit = True
        th.join(timeout=30)


def test_a_listener_that_stops_reading_cancels_the_request_and_the_engine_goes_on(tools, ggufs, tiny_models):
    eng = LlamaCppEngine("fp16_baseline", tiny_models.target, threads=1, max_context=256, tools=tools).load()
    try:
        ids = eng.tokenizer("def main():")["input_ids"]
        req = Request(id="gone", prompt_tokens=len(ids), expected_output_tokens=64)

        class Gone(Exception):
            pass

        def hang_up(rid, new, seen=[]):  # noqa: B006 - counts across calls
            seen.extend(new)
            if len(seen) >= 2:
                raise Gone

        with pytest.raises(Gone):
            eng.run([(req, ids)], on_token=hang_up)
        again = eng.run([(req, ids)])[0]
        assert again.output_tokens == 64 and len(again.token_times_ms) == 64
    finally:
        eng.close()
