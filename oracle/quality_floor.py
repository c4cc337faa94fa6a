"""The self-consistency floor: how often the reference model disagrees with itself.

A lossless mode (continuous batching, chunked prefill, prefix caching, speculation)
computes the same function as the reference, but batch shape, chunking and cache
reuse change the order of floating-point additions, and greedy decoding turns a tiny
difference in one logit into a different next token, then a different answer. That
divergence is the reference's own, not a lossy mode's: the study's quality rule
(mean ROUGE-L >= 0.80 against the reference's output) can only be read above it.

:func:`self_consistency_floor` measures it from a profile: per lossless mode and
family, the share of requests whose output differs from the reference's and their
ROUGE-L against it. It is reported beside the labels, never charged to a mode.
"""

from __future__ import annotations

import pandas as pd

from modeswitch.engine.modes import get_mode


def _lossless(mode: str) -> bool:
    try:
        return get_mode(mode).lossless
    except KeyError:  # a mode this engine's registry does not know (an imported profile's)
        return False


def _lossless_rows(modes: pd.Series) -> pd.Series:
    """Boolean per row: is its mode lossless. Decided once per distinct mode and always
    boolean, also for no rows (``map`` keeps an empty column's string dtype, which a
    boolean ``&`` then refuses: a profile of aggregate rows alone leaves none)."""
    lossless = [m for m in modes.dropna().unique() if _lossless(m)]
    return modes.isin(lossless).astype(bool)


def self_consistency_floor(profile: pd.DataFrame) -> pd.DataFrame:
    """Per lossless mode and family: requests scored, the share whose output differs from
    the reference's (ROUGE-L below 1), and their mean and lowest ROUGE-L against it.

    Reads the first clean trial of each measured request (``trial`` 0, the newest
    attempt) with its ``rouge_l_vs_baseline``; the reference's own rows are left out."""
    cols = ["mode", "family", "requests", "diverged_share", "rouge_l_mean", "rouge_l_min"]
    need = {"mode", "family", "request_id", "rouge_l_vs_baseline", "reference_mode"}
    if profile.empty or not need <= set(profile.columns):
        return pd.DataFrame(columns=cols)
    df = profile[profile["mode"] != profile["reference_mode"]]
    if "is_aggregate" in df:
        df = df[~df["is_aggregate"].fillna(False).astype(bool)]
    if "trial" in df:
        df = df[df["trial"] == 0]
    if "attempt" in df:
        df = df.sort_values("attempt").drop_duplicates(["mode", "request_id"], keep="last")
    df = df[_lossless_rows(df["mode"]) & df["rouge_l_vs_baseline"].notna()]
    if df.empty:
        return pd.DataFrame(columns=cols)
    g = df.assign(diverged=df["rouge_l_vs_baseline"] < 1.0).groupby(["mode", "family"])
    out = pd.DataFrame({"requests": g.size(), "diverged_share": g["diverged"].mean(),
                        "rouge_l_mean": g["rouge_l_vs_baseline"].mean(),
                        "rouge_l_min": g["rouge_l_vs_baseline"].min()}).reset_index()
    return out[cols]
