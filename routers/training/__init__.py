"""Training routers: the training table and its splits, Optuna tuning, MLflow tracking and
the served form of a trained router (``trainer.py`` drives a training run)."""
