"""Synthetic requests carry real benchmark text in the model's chat format, at their
family's lengths (engine/prompts.py, dataset/prompt_corpus.py)."""

import pytest

from modeswitch.dataset.prompt_corpus import load_corpus
from modeswitch.dataset.requests import Request
from modeswitch.dataset.workloads import get_workload, list_workloads
from modeswitch.engine.prompts import SYSTEM_PROMPT, PromptBuilder

CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                 "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def tokenizers(tiny_models):
    """The tiny model's tokenizer as it is (no chat template) and with a ChatML template."""
    from transformers import AutoTokenizer

    plain = AutoTokenizer.from_pretrained(tiny_models.target)
    chat = AutoTokenizer.from_pretrained(tiny_models.target)
    chat.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    chat.chat_template = CHAT_TEMPLATE
    return {"plain": plain, "chat": chat}


def test_every_study_family_names_suites_the_corpus_has():
    corpus = load_corpus()
    for spec in list_workloads():
        assert corpus.pick(spec.questions) and corpus.pick(spec.context), spec.name


@pytest.mark.parametrize("kind", ["plain", "chat"])
def test_lengths_are_met_with_real_questions_at_the_end(tokenizers, kind):
    tok = tokenizers[kind]
    b = PromptBuilder(tok)
    corpus = load_corpus()
    for name in ("short_prompt_long_output", "long_prompt_short_output", "long_prompt_long_output"):
        spec = get_workload(name)
        questions = {q.prompt for q in corpus.pick(spec.questions)}
        for r in spec.sample(4, seed=2):
            got, ids = b.prepare(r)
            assert got.prompt_tokens == len(ids)
            text = tok.decode(ids)
            asked = [q for q in questions if q in text]
            assert asked, "the prompt ends with one of the family's questions"
            if len(ids) > r.prompt_tokens:  # grew to fit the template and the shortest question
                assert len(tok(min(asked, key=len), add_special_tokens=False)["input_ids"]) + 8 > r.prompt_tokens
            else:
                assert len(ids) == r.prompt_tokens
            assert got.evaluation_mode is not None
            if kind == "chat":
                assert text.rstrip().endswith("<|im_start|>assistant")
            assert b.prepare(r)[1] == ids  # deterministic


def test_a_shared_prefix_is_a_system_turn_shared_token_for_token(tokenizers):
    tok = tokenizers["chat"]
    b = PromptBuilder(tok)
    reqs = get_workload("shared_prefix_chat").sample(5, seed=0)
    prepared = [b.prepare(r) for r in reqs]
    s = reqs[0].shared_prefix_tokens
    first = prepared[0][1][:s]
    for got, ids in prepared:
        assert got.shared_prefix_tokens == s and ids[:s] == first
    assert tok.decode(first).startswith("<|im_start|>system\n" + SYSTEM_PROMPT[:40])
    assert len({tuple(ids[s:]) for _, ids in prepared}) == len(prepared)  # suffixes differ
    # a shorter prefix of the same family is the start of the longer one
    import dataclasses

    short, ids = b.prepare(dataclasses.replace(reqs[0], id="short", shared_prefix_tokens=s // 2))
    assert ids[:s // 2] == first[:s // 2]


def test_gold_answers_ride_along_and_score_the_output(tokenizers):
    from modeswitch.dataset.benchmarks import score_answer

    b = PromptBuilder(tokenizers["plain"])
    got, _ = b.prepare(get_workload("long_prompt_long_output").sample(1, seed=5)[0])
    assert got.evaluation_mode == "final_answer_exact_match"
    assert score_answer(f"so the answer is {got.reference}", got.reference, got.evaluation_mode) == 1.0


def test_a_prompt_with_text_goes_through_the_chat_template(tokenizers):
    b = PromptBuilder(tokenizers["chat"])
    got, ids = b.prepare(Request(id="x", prompt="What is the capital of France?", prompt_tokens=1,
                                 expected_output_tokens=8))
    assert tokenizers["chat"].decode(ids) == ("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
                                             "<|im_start|>assistant\n")
    assert got.prompt_tokens == len(ids)


def test_a_missing_prompt_folder_is_one_clear_error(tmp_path, monkeypatch):
    from modeswitch.dataset.prompt_corpus import PROMPTS_ENV, prompts_dir

    monkeypatch.setenv(PROMPTS_ENV, str(tmp_path))
    with pytest.raises(ValueError, match="no benchmark prompt files"):
        prompts_dir()
