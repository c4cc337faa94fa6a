"""Turn requests into token ids for a tokenizer, in the model's chat format.

A request that carries token ids is used as is. One with prompt text is sent as a
user turn through the tokenizer's chat template (an instruct model answers chat, not
raw text; a tokenizer without a template gets the text itself). A synthetic request
(a shape only: prompt tokens, shared prefix, family) gets real text from the
benchmark samples (:mod:`modeswitch.dataset.prompt_corpus`) and meets its lengths in tokens:

* the **question** that ends the prompt is one of the family's ``questions`` suites,
  drawn from the request id among those that fit (the shortest when none does, so a
  prompt below the template's own tokens plus the shortest question grows to fit);
* the **shared prefix**, when the request has one, is a system turn: a system prompt
  and the family's fixed worked examples (``context`` suites), cut to the prefix's
  length, so every request of the family shares it token for token;
* the rest of the length is **context**: worked examples of the ``context`` suites
  drawn from the request id, whole ones last, so the prompt ends with complete
  examples and then the question, as a few-shot prompt does.

The chat template's tokens count towards the length (they are sent). Each prepared
request records its question's scoring (``evaluation_mode``, ``reference``), so a
mode's answers are scored against the gold answer where the suite has one.
Deterministic for a given tokenizer and corpus.
"""

from __future__ import annotations

import dataclasses
import hashlib

from modeswitch.dataset.prompt_corpus import PromptCorpus, load_corpus, worked_example
from modeswitch.dataset.registry import UnknownNameError
from modeswitch.dataset.requests import Request
from modeswitch.dataset.workloads import WorkloadSpec, get_workload

#: the system prompt a shared prefix opens with
SYSTEM_PROMPT = ("You are a helpful assistant. Answer the user's question accurately and concisely. "
                 "The worked examples below show questions like the user's with their correct answers.\n\n")
_SYS, _USR = "\x00SYSTEM\x00", "\x00USER\x00"


#: the text of a request whose family is not registered: every suite's questions
_ANY = WorkloadSpec("any", "a request of no registered family", "plain", 1, 1)


def _family(name: str | None) -> WorkloadSpec:
    try:
        return get_workload(name) if name else _ANY
    except UnknownNameError:
        return _ANY


def _offset(key: str, n: int) -> int:
    return int(hashlib.sha256(key.encode()).hexdigest()[:12], 16) % max(n, 1)


class PromptBuilder:
    def __init__(self, tokenizer, corpus: PromptCorpus | None = None):
        self.tokenizer = tokenizer
        self.chat = bool(getattr(tokenizer, "chat_template", None))
        self._corpus = corpus
        self._questions: dict[tuple, list] = {}
        self._example_ids: dict[str, list[int]] = {}
        self._turns = {}

    @property
    def corpus(self) -> PromptCorpus:
        if self._corpus is None:
            self._corpus = load_corpus()
        return self._corpus

    def _enc(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def chat_ids(self, user: str) -> list[int]:
        """A user turn in the chat template, ready for the assistant's answer."""
        return list(self.tokenizer.apply_chat_template([{"role": "user", "content": user}],
                                                       add_generation_prompt=True, tokenize=True,
                                                       return_dict=True)["input_ids"])

    def turns(self, system: bool) -> tuple[list[int], list[int], list[int]]:
        """The template's own ids: (before the system text, between it and the user text,
        after the user text); with ``system`` False the first holds the template's
        opening (a default system turn, for some models) and the second is empty."""
        if system not in self._turns:
            if not self.chat:
                self._turns[system] = ([], self._enc("\n\n") if system else [], [])
            else:
                msgs = ([{"role": "system", "content": _SYS}] if system else []) + [{"role": "user", "content": _USR}]
                text = self.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
                head, _, rest = text.partition(_SYS) if system else ("", "", text)
                mid, _, tail = rest.partition(_USR)
                self._turns[system] = (self._enc(head), self._enc(mid), self._enc(tail)) if system \
                    else (self._enc(mid), [], self._enc(tail))
        return self._turns[system]

    def _suite_ids(self, suites: tuple[str, ...]) -> list[tuple[Request, list[int]]]:
        if suites not in self._questions:
            qs = self.corpus.pick(suites)
            enc = self.tokenizer([q.prompt for q in qs], add_special_tokens=False)["input_ids"]
            self._questions[suites] = list(zip(qs, enc))
        return self._questions[suites]

    def _question(self, key: str, suites: tuple[str, ...], budget: int) -> tuple[Request, list[int]]:
        pool = self._suite_ids(suites)
        fits = [p for p in pool if len(p[1]) <= budget]
        if not fits:
            return min(pool, key=lambda p: len(p[1]))
        return fits[_offset(key, len(fits))]

    def _examples(self, key: str, suites: tuple[str, ...], n_tokens: int, skip: str | None = None,
                  last: bool = True) -> list[int]:
        """``n_tokens`` of worked examples in an order drawn from ``key``, each tokenised on
        its own (so a longer cut extends a shorter one token for token): the last
        ``n_tokens``, so the text ends on a whole example, or with ``last`` False the
        first (a shared prefix, cut at its own length)."""
        if n_tokens <= 0:
            return []
        pool = self.corpus.pick(suites)
        start, ids = _offset(key, len(pool)), []
        for i in range(len(pool)):
            q = pool[(start + i) % len(pool)]
            if q.id != skip:
                if q.id not in self._example_ids:
                    self._example_ids[q.id] = self._enc(worked_example(q))
                ids += self._example_ids[q.id]
                if len(ids) >= n_tokens:
                    break
        return ids[-n_tokens:] if last else ids[:n_tokens]

    def prepare(self, req: Request) -> tuple[Request, list[int]]:
        if req.prompt_token_ids:
            return dataclasses.replace(req, prompt_tokens=len(req.prompt_token_ids)), list(req.prompt_token_ids)
        if req.prompt:
            ids = self.chat_ids(req.prompt) if self.chat else \
                list(self.tokenizer(req.prompt, add_special_tokens=True)["input_ids"])
            return dataclasses.replace(req, prompt_tokens=len(ids),
                                       shared_prefix_tokens=min(req.shared_prefix_tokens, len(ids))), ids
        return self._synthetic(req)

    def _synthetic(self, req: Request) -> tuple[Request, list[int]]:
        spec = _family(req.family or req.workload)
        p, s = req.prompt_tokens, min(req.shared_prefix_tokens, req.prompt_tokens)
        head, mid, tail = self.turns(system=s > 0)
        prefix = head
        if s > 0:
            family = req.family or req.workload or "unknown"
            system = self._enc(SYSTEM_PROMPT) + self._examples(f"prefix:{family}", spec.context, s, last=False)
            prefix = (head + system)[:max(s, len(head) + 1)]
        budget = p - len(prefix) - len(mid) - len(tail)
        q, q_ids = self._question(f"question:{req.id}", spec.questions, budget)
        context = self._examples(f"context:{req.id}", spec.context, budget - len(q_ids), skip=q.id)
        ids = prefix + mid + context + q_ids + tail
        req = dataclasses.replace(req, prompt_tokens=len(ids), shared_prefix_tokens=len(prefix) if s else 0,
                                  evaluation_mode=q.evaluation_mode, reference=q.reference)
        return req, ids
