"""A draft distilled from its target (engine/models/draft.py), on the tiny fixture as the
target with a seconds-long recipe: the same code path as SmolLM2's draft."""

import json

import pytest

from modeswitch.dataset.requests import Request
from modeswitch.engine.models.draft import CARD, TEST_RECIPE, build_draft, split_prompts


@pytest.fixture(scope="module")
def drafted(tiny_models):
    return build_draft(tiny_models.target, TEST_RECIPE, log=lambda *a: None)


def test_the_draft_is_distilled_beside_its_target_with_a_card(tiny_models, drafted):
    from transformers import AutoConfig

    assert drafted.folder.parent == tiny_models.target.parent
    assert drafted.folder.name.startswith(f"{tiny_models.target.name}-draft-")
    card = json.loads((drafted.folder / CARD).read_text())
    assert card == drafted.card
    assert card["target"]["folder"] == str(tiny_models.target)
    assert len(card["target"]["model_safetensors_sha256"]) == 64
    assert card["recipe"]["layers"] == list(TEST_RECIPE.layers) and card["recipe_key"] == TEST_RECIPE.key()
    assert card["prompts"]["train"] == TEST_RECIPE.train_prompts
    assert card["prompts"]["held_out"] == TEST_RECIPE.held_out_prompts
    assert card["train"]["steps"] == TEST_RECIPE.steps
    assert card["final_loss"] < card["train"]["first_loss"]
    assert 0 <= card["held_out_acceptance_rate"] <= 1 and card["build_seconds"] > 0
    # distilling taught it something the copied layers alone did not know
    assert card["held_out_acceptance_rate"] > card["held_out_acceptance_rate_before_training"]
    cfg, target_cfg = AutoConfig.from_pretrained(drafted.folder), AutoConfig.from_pretrained(tiny_models.target)
    assert cfg.num_hidden_layers == len(TEST_RECIPE.layers) < target_cfg.num_hidden_layers
    assert cfg.vocab_size == target_cfg.vocab_size
    assert (drafted.folder / "tokenizer.json").read_text() == (tiny_models.target / "tokenizer.json").read_text()


def test_a_cached_draft_is_reused_without_training(tiny_models, drafted, monkeypatch):
    import modeswitch.engine.models.draft as draft

    def no_training(*a, **k):
        raise AssertionError("rebuilt a cached draft")

    monkeypatch.setattr(draft, "train_draft", no_training)
    monkeypatch.setattr(draft, "teacher_answers", no_training)
    again = build_draft(tiny_models.target, TEST_RECIPE, log=lambda *a: None)
    assert again.folder == drafted.folder and again.card == drafted.card


def test_the_draft_starts_from_the_targets_own_weights(tiny_models):
    import torch
    from transformers import AutoModelForCausalLM

    from modeswitch.engine.models.draft import init_draft

    target = AutoModelForCausalLM.from_pretrained(tiny_models.target, dtype=torch.float32)
    d = init_draft(target, (1,))
    assert torch.equal(d.model.layers[0].mlp.up_proj.weight, target.model.layers[1].mlp.up_proj.weight)
    assert torch.equal(d.get_input_embeddings().weight, target.get_input_embeddings().weight)
    assert torch.equal(d.model.norm.weight, target.model.norm.weight)
    with pytest.raises(ValueError, match="layers"):
        init_draft(target, (7,))


def test_training_prompts_are_held_out_of_every_request_the_project_builds(tiny_models):
    from transformers import AutoTokenizer

    from modeswitch.dataset.prompt_corpus import in_draft_split, load_corpus

    corpus = load_corpus()
    used = {q.id for q in corpus.pick(())}
    held = {q.id for qs in corpus.draft_split.values() for q in qs}
    assert held and used and not used & held
    assert all(in_draft_split(i) for i in held) and not any(in_draft_split(i) for i in used)
    tok = AutoTokenizer.from_pretrained(tiny_models.target)
    train, held_out, _ = split_prompts(tok, TEST_RECIPE)
    texts = {tuple(tok(q.prompt, add_special_tokens=True)["input_ids"]) for qs in corpus.draft_split.values()
             for q in qs}
    assert all(tuple(p) in texts for p in train + held_out)
    assert not {tuple(p) for p in train} & {tuple(p) for p in held_out}


def test_speculative_decoding_with_the_distilled_draft_gives_the_reference_output(tiny_models, drafted):
    from transformers import AutoTokenizer

    from modeswitch.engine.backends.transformers_backend import TransformersEngine
    from modeswitch.engine.prompts import PromptBuilder

    b = PromptBuilder(AutoTokenizer.from_pretrained(tiny_models.target))
    reqs = [b.prepare(Request(id=str(i), prompt_tokens=p, expected_output_tokens=n))
            for i, (p, n) in enumerate([(120, 24), (60, 16)])]
    out = {}
    for mode in ("fp16_baseline", "speculative_decoding"):
        e = TransformersEngine(mode, tiny_models.target, drafted.folder).load()
        out[mode] = [e.run([r])[0].output_ids for r in reqs]
        if mode == "speculative_decoding":
            assert e.draft.config.num_hidden_layers == len(TEST_RECIPE.layers)
        e.close()
    assert out["speculative_decoding"] == out["fp16_baseline"]


def test_smollm2_gets_its_draft_only_when_a_mode_needs_one(tiny_models, tmp_path, monkeypatch):
    import modeswitch.engine.models.draft as draft
    import modeswitch.engine.models.smollm2 as smollm2
    from modeswitch.engine.models.resolve import needs_draft, resolve_models

    built = []
    monkeypatch.setattr(smollm2, "build_smollm2", lambda *a, **k: smollm2.BuiltModel(tiny_models.target, {}))
    monkeypatch.setattr(draft, "build_draft", lambda folder, **k: built.append(folder) or
                        draft.BuiltDraft(tmp_path / "distilled", {}))
    assert needs_draft(None) and needs_draft(["int8_quant", "speculative_decoding"])
    assert not needs_draft(["fp16_baseline", "quantized_draft_speculative"]) and not needs_draft(())
    assert resolve_models("smollm2", modes=["fp16_baseline", "int8_quant"])[1] is None and not built
    assert resolve_models("smollm2", modes=["speculative_decoding"])[1] == tmp_path / "distilled"
    assert resolve_models("smollm2")[1] == tmp_path / "distilled"  # every mode
    assert built == [tiny_models.target] * 2
    given = resolve_models("smollm2", str(tiny_models.draft))[1]  # --draft-model wins, nothing built
    assert given == tiny_models.draft and len(built) == 2


def test_another_recipe_is_another_cache_entry_and_the_hidden_state_term_trains(tiny_models, drafted):
    from dataclasses import replace

    recipe = replace(TEST_RECIPE, hidden_weight=0.5, steps=5)
    other = build_draft(tiny_models.target, recipe, log=lambda *a: None)
    assert other.folder != drafted.folder and other.folder.parent == drafted.folder.parent
    assert other.card["recipe"]["hidden_weight"] == 0.5 and other.card["train"]["steps"] == 5


def test_the_build_is_deterministic(tiny_models, drafted):
    from modeswitch.dataset.io import sha256_file

    weights = sha256_file(drafted.folder / "model.safetensors")
    written = (drafted.folder / CARD).stat().st_mtime_ns
    again = build_draft(tiny_models.target, TEST_RECIPE, force=True, log=lambda *a: None)
    assert (again.folder / CARD).stat().st_mtime_ns != written  # rebuilt, not reused
    assert again.folder == drafted.folder and sha256_file(again.folder / "model.safetensors") == weights
    assert again.card["held_out_acceptance_rate"] == drafted.card["held_out_acceptance_rate"]
    assert again.card["final_loss"] == drafted.card["final_loss"]


def test_the_cache_key_follows_what_made_the_target_not_how_long_it_took(tmp_path):
    from modeswitch.engine.models.draft import DraftRecipe, draft_folder

    def folder(card):
        (tmp_path / "m").mkdir(exist_ok=True)
        (tmp_path / "m" / CARD).write_text(json.dumps(card))
        return draft_folder(tmp_path / "m", DraftRecipe(), "prompts")

    first = folder({"source": "a", "build_seconds": 20.1})
    assert folder({"source": "a", "build_seconds": 31.0}) == first  # re-converted: same draft
    assert folder({"source": "b", "build_seconds": 20.1}) != first
    assert draft_folder(tmp_path / "m", DraftRecipe(lr=1e-3), "prompts") != first


def test_the_draft_trains_in_bf16_only_where_the_cpu_has_it_natively():
    from modeswitch.engine.hardware import native_bf16
    from modeswitch.engine.models.draft import FP32_RECIPE, DraftRecipe, default_recipe

    assert default_recipe(["avx2", "avx512f", "avx512_bf16"]) == DraftRecipe()
    assert default_recipe(["avx2", "amx_tile", "amx_bf16"]) == DraftRecipe()
    avx2 = default_recipe(["avx2"])
    assert avx2 == FP32_RECIPE and avx2.teacher_dtype == "float32" and not avx2.train_bf16
    assert avx2.key() != DraftRecipe().key()  # another draft, cached apart
    assert not native_bf16(["avx2", "avx512f", "avx512_vnni"]) and not native_bf16([])
