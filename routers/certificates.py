"""The certificates a training run can ask for, by name (``--certificate``, study.toml
``[train] certificate``): each name is a set of :class:`modeswitch.routers.certified.CertifiedRouter`
options (docs/training.md, "Certificates that hold per family").

Why a module of its own: the trainer reads the options, the study's config and the CLI
only the names, and importing the trainer (MLflow, Optuna) to check a name would slow
every command's start.
"""

#: --certificate -> CertifiedRouter's options
CERTIFICATES = {
    "pooled": {},
    "per-family": {"group_conditional": True},
    "family-held-out": {"cross_fit_groups": True},
    "per-family-held-out": {"group_conditional": True, "cross_fit_groups": True},
    "family-cross-fit": {"cross_fit_groups": True, "calibrate_on": "all"},
    "per-family-cross-fit": {"group_conditional": True, "cross_fit_groups": True, "calibrate_on": "all"},
}
