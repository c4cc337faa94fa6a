"""Content features: what a prompt says, read from its token ids through one table.

Why: shape features (lengths, prefix, concurrency) cannot tell two requests of one
family apart, and what makes a lossy mode fail on one request and not another is the
text (the quantisation-flip literature: arXiv 2407.09141, 2405.00632). A server
holds the prompt's token ids before it picks a mode, so every feature here is read
from them alone, through a per-model :class:`ContentTable` (one row per vocabulary
entry): a table lookup and two means, a few microseconds per request, no model call.

The features (:data:`CONTENT_FEATURES`):

* ``digit_share``, ``code_share``, ``non_ascii_share``: the share of the prompt's
  last :data:`SHARE_TOKENS` tokens whose text holds a digit, a code character (``{}[];`=<>_#\\|``), or a
  non-ASCII character (arithmetic, code and other scripts are where small models and
  their quantised copies part ways first);
* ``embed_pc1`` .. ``embed_pc8``: the mean of the model's own input embeddings over
  the prompt's last :data:`TAIL_TOKENS` tokens (where the question is), projected on
  the embedding matrix's top eight principal directions: a topic and register
  signature, as RouteLLM's and the semantic router's prompt embeddings are, for a
  table lookup instead of an encoder's forward pass.

The table is made by the engine from a checkpoint (``modeswitch.engine.content_table``): this
room holds only the arithmetic, so a router, the training table and the server
compute the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

#: principal directions of the input embeddings kept
EMBED_COMPONENTS = 8
#: the prompt's last tokens the embedding mean reads (the question)
TAIL_TOKENS = 64
#: the prompt's last tokens the shares read: the question and the examples before it; a
#: cap, so a long prompt costs what a short one does (turning a Python list of ids into
#: an array is most of the cost: 31 us with it, 12 us without, for 500 ids in one timeit
#: run here)
SHARE_TOKENS = 256
SHARE_FEATURES = ("digit_share", "code_share", "non_ascii_share")
CONTENT_FEATURES = SHARE_FEATURES + tuple(f"embed_pc{i + 1}" for i in range(EMBED_COMPONENTS))
#: characters whose presence marks a token as code
CODE_CHARS = frozenset("{}[];`=<>_#\\|")


@dataclass(frozen=True, eq=False)
class ContentTable:
    """Per vocabulary entry: its share flags (digit, code, non-ASCII: 0 or 1) then its
    input embedding's principal components, as one float64 array ``rows`` (vocabulary x
    ``len(CONTENT_FEATURES)``). ``model``: the checkpoint it was made from."""

    model: str
    rows: object  # numpy.ndarray (vocabulary x features)

    def __post_init__(self):
        import numpy as np  # only once a table exists: the feature names (CLI help, registry) need none

        if np.ndim(self.rows) != 2 or np.shape(self.rows)[1] != len(CONTENT_FEATURES):
            raise ValueError(f"content table for {self.model}: rows must be (vocabulary, {len(CONTENT_FEATURES)}), "
                             f"not {np.shape(self.rows)}")
        n = len(SHARE_FEATURES)  # each part contiguous: take() on a contiguous array is twice as fast
        object.__setattr__(self, "_flags", np.ascontiguousarray(self.rows[:, :n], dtype=np.float64))
        object.__setattr__(self, "_embed", np.ascontiguousarray(self.rows[:, n:], dtype=np.float64))

    def features(self, token_ids):
        """The content features of one prompt (:data:`CONTENT_FEATURES`' order); an empty
        prompt reads as zeros; an id outside the vocabulary is an error naming it."""
        import numpy as np  # a module already loaded here (the table holds arrays): a dict lookup

        ids = np.asarray(token_ids[-SHARE_TOKENS:], dtype=np.intp)
        out = np.zeros(len(CONTENT_FEATURES))
        if not ids.size:
            return out
        if ids.min() < 0:  # take() would read from the table's end
            raise ValueError(f"token id {int(ids.min())} is negative: not an id of {self.model}'s vocabulary")
        n = len(SHARE_FEATURES)
        tail = ids[-TAIL_TOKENS:]
        try:
            out[:n] = self._flags.take(ids, axis=0).sum(axis=0) / len(ids)
            out[n:] = self._embed.take(tail, axis=0).sum(axis=0) / len(tail)
        except IndexError:
            bad = ids[(ids < 0) | (ids >= len(self.rows))][0]
            raise ValueError(f"token id {int(bad)} is outside {self.model}'s vocabulary of {len(self.rows)}: "
                             "content features read ids of the model they were made for") from None
        return out


def token_flags(text: str) -> tuple[float, float, float]:
    """(holds a digit, holds a code character, holds a non-ASCII character) of one token's
    text, each 0.0 or 1.0."""
    return (float(any(c.isdigit() for c in text)), float(any(c in CODE_CHARS for c in text)),
            float(any(ord(c) > 127 for c in text)))
