"""The llama.cpp backend's plan, without its programs: each mode's server arguments, its
capabilities, the GGUF cache keys and the token ids the server's stream holds back.
(tests/backend_llamacpp/ runs the real server: ``make test-llamacpp``.)"""

import io
import json
import tarfile
from pathlib import Path

import pytest

from modeswitch.dataset.requests import Request
from modeswitch.engine.backends import llamacpp_backend as lb
from modeswitch.engine.backends.base import EngineSettings
from modeswitch.engine.backends.registry import get_backend
from modeswitch.engine.models import gguf, llamacpp_tools
from modeswitch.engine.modes import get_mode, list_modes


def args_of(mode, draft=Path("d.gguf"), threads=1, context=1024):
    return lb.server_args(get_mode(mode), Path("m.gguf"), draft, 8080, threads, context, Path("/tmp/s"))


def flag(args, name):
    return args[args.index(name) + 1] if name in args else None


def test_every_mode_says_how_llamacpp_runs_it_or_why_not():
    caps = get_backend("llamacpp").capabilities(EngineSettings("m", draft_path="d"))
    assert caps.reference_precision == "float32"
    for m in list_modes():
        s = caps.support(m.name)
        assert (s.how if s.supported else s.reason), m.name
    assert not caps.support("int8_weight_only").supported and "activations" in caps.support("int8_weight_only").reason
    assert not caps.support("cuda_graphs").supported
    assert "Q8_0" in caps.support("int8_quant").how and "Q4_K_M" in caps.support("gptq_4bit").how
    assert "Q4_0" in caps.support("awq_4bit").how
    no_draft = get_backend("llamacpp").capabilities(EngineSettings("m"))
    assert not no_draft.support("speculative_decoding").supported
    assert no_draft.support("quantized_draft_speculative").supported  # its draft is the model's own Q8_0
    assert lb.capabilities(checkpoints={"reference": "F16"}).reference_precision == "float16"


def test_the_reference_and_each_mode_differ_from_it_only_in_their_own_setting():
    ref = args_of("fp16_baseline")
    assert flag(ref, "-np") == "1" and "-nocb" in ref and flag(ref, "-b") == str(lb.BATCH)
    assert flag(ref, "-ub") == str(lb.UBATCH) and flag(ref, "--cache-ram") == "0"
    assert flag(ref, "-t") == "1" and "-md" not in ref and "--cache-type-k" not in ref

    def changed(mode):
        a = args_of(mode)
        return {k: (flag(ref, k), flag(a, k)) for k in set(ref + a) if k.startswith("-")
                and flag(ref, k) != flag(a, k)}

    assert set(changed("kv_cache_compression")) == {"--cache-type-k", "--cache-type-v"}
    assert changed("chunked_prefill") == {"-b": (str(lb.BATCH), "256"), "-ub": (str(lb.UBATCH), "256")}
    cb = args_of("continuous_batching")
    assert flag(cb, "-np") == "16" and "-cb" in cb and flag(cb, "-c") == str(16 * 1024)
    assert set(changed("prefix_caching")) == {"--slot-save-path"}
    spec = args_of("speculative_decoding")
    assert flag(spec, "-md") == "d.gguf" and flag(spec, "--spec-draft-n-max") == "5"
    assert flag(spec, "--spec-type") == "draft-simple"
    ngram = args_of("ngram_speculative_decoding", draft=None)
    assert flag(ngram, "--spec-type") == "ngram-simple" and "-md" not in ngram
    hybrid = args_of("int8_plus_continuous_batching")
    assert flag(hybrid, "-np") == "16"  # the weights are the GGUF given, Q8_0 by weight_key
    assert lb.weight_key(get_mode("int8_plus_continuous_batching")) == "int8"
    with pytest.raises(ValueError, match="no draft GGUF"):
        args_of("speculative_decoding", draft=None)


def test_a_prompt_cache_is_used_only_by_the_modes_that_cache_prefixes():
    e = lb.LlamaCppEngine("prefix_caching", "m")
    r = Request(id="a", prompt_tokens=4, expected_output_tokens=3)
    assert e._payload(r, [1, 2], True)["cache_prompt"] is True
    ref = lb.LlamaCppEngine("fp16_baseline", "m")._payload(r, [1, 2], False)
    assert ref["cache_prompt"] is False and ref["n_predict"] == 3 and ref["temperature"] == 0.0
    with pytest.raises(ValueError, match="weight-only int8"):
        lb.LlamaCppEngine("int8_weight_only", "m")


class ByteLevelTokenizer:
    """A byte-level BPE vocabulary in GPT-2's alphabet: every byte, and a few merges."""

    def __init__(self):
        alpha = lb.bytes_to_unicode()
        self.vocab = {alpha[b]: b for b in range(256)}
        for i, word in enumerate([b"ab", "é".encode(), "é".encode()[:1] + b"x"]):
            self.vocab["".join(alpha[b] for b in word)] = 256 + i

    def get_vocab(self):
        return self.vocab

    def decode(self, ids):
        return ""


def test_token_ids_the_stream_held_back_are_found_again_from_the_text():
    vocab = lb.ByteVocab(ByteLevelTokenizer())
    e_acute = "é".encode()
    assert vocab.split(b"ab", 1) == [256] and vocab.split(b"ab", 2) == [97, 98]
    assert vocab.split(e_acute[:1], 1) == [e_acute[0]]
    engine = lb.LlamaCppEngine("fp16_baseline", "m")
    engine._vocab = vocab
    # the server made 3 tokens: 'a', then the first byte of 'é' (held back), then its second byte
    chunk = {"tokens": [e_acute[1]], "tokens_predicted": 3, "content": "é"}
    assert engine._new_ids(chunk, [97]) == [e_acute[0], e_acute[1]]
    assert engine._new_ids({"tokens": [98], "tokens_predicted": 2, "content": "b"}, [97]) == [98]
    with pytest.raises(RuntimeError, match="held back"):
        engine._new_ids({"tokens": [98], "tokens_predicted": 4, "content": "b"}, [97])


def test_a_gguf_is_cached_by_what_made_it(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "modeswitch_model.json").write_text(json.dumps({"source": "a", "build_seconds": 3}))
    tools = llamacpp_tools.LlamaCppTools(tmp_path, tmp_path, {"version": "0.3.36", "sdist_sha256": "x"})
    q8 = gguf.gguf_path(folder, "Q8_0", tools)
    assert q8.parent == tmp_path / "model-gguf" and q8.name.startswith("q8_0-")
    assert gguf.gguf_path(folder, "Q4_0", tools) != q8
    (folder / "modeswitch_model.json").write_text(json.dumps({"source": "a", "build_seconds": 9}))
    assert gguf.gguf_path(folder, "Q8_0", tools) == q8  # rebuilt the same way: same file
    other = llamacpp_tools.LlamaCppTools(tmp_path, tmp_path, {"version": "0.3.37", "sdist_sha256": "y"})
    assert gguf.gguf_path(folder, "Q8_0", other) != q8
    with pytest.raises(ValueError, match="Q4_1"):
        gguf.gguf_path(folder, "Q4_1", tools)  # the wheel's own grid is never a mode's


def test_the_vendored_tree_is_taken_from_the_source_package(tmp_path):
    sdist = tmp_path / "llama_cpp_python-0.3.36.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        for name, data in [("llama_cpp_python-0.3.36/vendor/llama.cpp/convert_hf_to_gguf.py", b"x"),
                           ("llama_cpp_python-0.3.36/vendor/llama.cpp/gguf-py/gguf/__init__.py", b"y"),
                           ("llama_cpp_python-0.3.36/llama_cpp/llama.py", b"z")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    src = llamacpp_tools._extract(sdist, tmp_path / "src")
    assert (src / "convert_hf_to_gguf.py").read_bytes() == b"x" and (src / "gguf-py/gguf/__init__.py").exists()
    assert not (src / "llama_cpp").exists()


def test_a_users_own_build_is_taken_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(llamacpp_tools.TOOLS_ENV, str(tmp_path))
    with pytest.raises(ValueError, match="no llama-server"):
        llamacpp_tools.find_tools()
    (tmp_path / "llama-server").write_text("")
    (tmp_path.parent / "convert_hf_to_gguf.py").write_text("")
    tools = llamacpp_tools.find_tools()
    assert tools.bin == tmp_path and tools.convert_script == tmp_path.parent / "convert_hf_to_gguf.py"
    assert llamacpp_tools.build_tools() is not None  # nothing built


def test_the_build_is_keyed_by_the_cpu_kind(monkeypatch):
    monkeypatch.setattr(llamacpp_tools, "cpu_isa", lambda: ["avx2"])
    avx2 = llamacpp_tools.build_key()
    monkeypatch.setattr(llamacpp_tools, "cpu_isa", lambda: ["avx2", "avx512f"])
    assert llamacpp_tools.build_key() != avx2
