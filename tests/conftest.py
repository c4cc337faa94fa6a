from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
A100 = SHARED / "reference" / "a100"
BENCHMARKS = SHARED / "reference" / "benchmarks"


@pytest.fixture
def a100_dir():
    if not A100.is_dir():
        pytest.skip(f"published A100 profiles not present at {A100} (a user's clone has no ../shared)")
    return A100


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """The project's model builder with the test recipe (seconds, same code path)."""
    from modeswitch.engine.models.tiny import TEST_RECIPE, build_models

    models = build_models(tmp_path_factory.mktemp("mscache"), TEST_RECIPE, log=lambda *a: None)
    # every step trained, whatever the machine's load: tests read this model's outputs
    assert [models.card[k]["steps"] for k in ("target", "draft")] == [TEST_RECIPE.target_steps,
                                                                     TEST_RECIPE.draft_steps]
    return models
