"""``--model tiny``'s recipe stays a build of well under a minute on 2 cores: its sizes
are pinned here, and its training compute is bounded, so growing it is a decision that
changes this test. How long a build takes is measured by running it
(``modeswitch model build --model tiny --force``), not here."""

from modeswitch.engine.models.tiny import TEST_RECIPE, ArchConfig, BuildRecipe

#: training FLOPs (6 x matmul parameters x tokens, summed over target and draft) the
#: default recipe may spend: its sizes need about 1.2e12
MAX_TRAIN_FLOPS = 1.5e12


def _matmul_params(arch: ArchConfig, vocab: int) -> int:
    """Weights every token multiplies through: the decoder layers (attention and MLP)
    and the output layer (tied to the embeddings)."""
    per_layer = 4 * arch.hidden_size ** 2 + 3 * arch.hidden_size * arch.intermediate_size
    return arch.num_hidden_layers * per_layer + vocab * arch.hidden_size


def train_flops(recipe: BuildRecipe) -> float:
    tokens_per_step = recipe.batch_size * recipe.seq_len
    return sum(6 * _matmul_params(arch, recipe.vocab_size) * steps * tokens_per_step
               for arch, steps in ((recipe.target, recipe.target_steps), (recipe.draft, recipe.draft_steps)))


def test_the_tiny_models_recipe_keeps_its_sizes():
    r = BuildRecipe()
    assert (r.vocab_size, r.corpus_bytes, r.seq_len, r.batch_size) == (1024, 1_000_000, 128, 16)
    assert (r.target, r.target_steps) == (ArchConfig(128, 2, 352, 2), 150)
    assert (r.draft, r.draft_steps) == (ArchConfig(64, 1, 176, 2), 150)
    assert r.stage_time_cap_s is None  # every step trained, whatever the machine's load


def test_the_tiny_models_training_compute_is_bounded():
    assert train_flops(BuildRecipe()) <= MAX_TRAIN_FLOPS
    assert train_flops(TEST_RECIPE) <= MAX_TRAIN_FLOPS


def test_the_draft_is_smaller_than_its_target():
    """Speculative decoding gains only when drafting costs less than the target's step."""
    for r in (BuildRecipe(), TEST_RECIPE):
        assert _matmul_params(r.draft, r.vocab_size) < _matmul_params(r.target, r.vocab_size) / 2

