"""A speculative draft for a model that comes without one, distilled from the model itself.

SmolLM2-135M-Instruct has no smaller sibling here, and a draft must share its target's
tokenizer, so the ``speculative_decoding`` mode had nothing to draft with on the
default model. This module makes one:

* **initialised from the target**: its (tied) embeddings and lm_head, its final norm and
  a few of its decoder layers (``DraftRecipe.layers``), so the draft starts in the
  target's hidden space instead of from random weights (a random draft accepts 0 %);
* **distilled on the target's own greedy outputs**: the target answers chat prompts of
  the prompt corpus's draft split (:data:`modeswitch.dataset.prompt_corpus.DRAFT_SPLIT`, held out
  of every profile, study and live evaluation) greedily; the draft learns, by cross-
  entropy, the target's greedy next token at every position of those answers and at
  sampled positions of the prompts (the target's prefill predicts those for free);
* **judged on held-out prompts** of the same split: the acceptance rate is the fraction
  of positions of the target's fp32 greedy answers where the draft's greedy token
  equals the target's, which is the per-token acceptance probability of greedy
  speculative decoding.

The lm_head (hidden x vocabulary: 576 x 49,152 on SmolLM2, 28 M of its 135 M
parameters) is shared by the draft and costs it as much per token as about 8 decoder
layers, so a draft of a few layers still costs a quarter of the target per token; it
stays frozen in training (tied to the embeddings), and only the draft's layers and norm
learn. The answers for training are generated in ``DraftRecipe.teacher_dtype``: bf16
where the CPU computes it natively (AVX512-BF16 or AMX), where it is faster than fp32;
fp32 elsewhere, where bf16 is emulated and slower (:func:`default_recipe`). The held-out
answers that the acceptance rate is measured on are always the target's fp32 greedy output.

The draft is an ordinary checkpoint of the target's architecture with fewer layers
(transformers and vLLM load it as they load the target), cached beside the target's
folder as ``<target>-draft-<key>`` with a model card (:data:`CARD`); the key hashes the
recipe, the target's card and the training prompts. Seeded: the same recipe, target
and thread count give the same draft.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import inspect
import json
import platform
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from modeswitch.dataset.io import atomic_folder, sha256_file
from modeswitch.dataset.prompt_corpus import load_corpus
from modeswitch.engine.hardware import native_bf16
from modeswitch.engine.models.cache import CARD
from modeswitch.engine.models.optimise import apply_step, warmup_cosine


@dataclass(frozen=True)
class DraftRecipe:
    """Everything that determines the draft (hashed into its cache key)."""

    #: the target's decoder layers the draft starts from, in order
    layers: tuple[int, ...] = (0, 1)
    #: distillation prompts and held-out prompts, both from the corpus's draft split
    train_prompts: int = 128
    held_out_prompts: int = 24
    #: prompts longer than this (chat template included) are skipped
    max_prompt_tokens: int = 160
    #: greedy tokens the target answers each prompt with
    answer_tokens: int = 32
    #: prompt positions per sequence also taught by cross-entropy (the target's prefill
    #: predicts them)
    prompt_positions: int = 24
    #: weight of the squared distance between the draft's and the target's final hidden
    #: states at every position (0: cross-entropy only). Tried at 1.0 on SmolLM2 (96
    #: prompts, 50 steps, lr 2e-3): held-out acceptance 0.228 against 0.241 without it
    hidden_weight: float = 0.0
    teacher_dtype: str = "bfloat16"
    #: prompts per batch when the target answers
    generate_batch: int = 32
    steps: int = 100
    batch_size: int = 16
    #: tried on SmolLM2 (96 prompts, 50 steps, cross-entropy only): 2e-3 -> held-out
    #: acceptance 0.241, 5e-3 -> 0.253, 1e-2 -> 0.236
    lr: float = 5e-3
    #: train the draft under bf16 autocast (faster only where the CPU has native bf16)
    train_bf16: bool = True
    seed: int = 0
    #: stop training early past this many seconds (a slow or busy machine: the card
    #: records the steps done); about 1.3 s a step on one thread here
    train_time_cap_s: float = 180.0

    def key(self) -> str:
        blob = json.dumps(asdict(self), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


#: The recipe for a CPU without native bf16 (no AVX512-BF16 or AMX): there bf16 runs
#: emulated, slower than fp32, and the default recipe's training stops at its time cap
#: after a few steps. So the teacher answers and the draft trains in fp32, on fewer
#: prompts and smaller batches, sized so that every planned step fits in the cap.
FP32_RECIPE = DraftRecipe(train_prompts=96, teacher_dtype="float32", steps=60, batch_size=8,
                          train_bf16=False, train_time_cap_s=240.0)


def default_recipe(isa: list[str] | None = None) -> DraftRecipe:
    """The draft recipe for this CPU (``isa``: its instruction sets, read when None):
    bf16 where the CPU has it natively, :data:`FP32_RECIPE` elsewhere."""
    return DraftRecipe() if native_bf16(isa) else FP32_RECIPE


#: A seconds-long recipe for the tiny test fixture: the same code path, tiny sizes.
TEST_RECIPE = DraftRecipe(layers=(0,), train_prompts=24, held_out_prompts=8, max_prompt_tokens=96,
                          answer_tokens=16, prompt_positions=16, teacher_dtype="float32",
                          generate_batch=8, steps=30, batch_size=8, lr=2e-3, train_bf16=False)


@dataclass
class BuiltDraft:
    folder: Path
    card: dict


def draft_folder(target: Path, recipe: DraftRecipe, prompts_key: str) -> Path:
    """Where the draft of ``target`` made by ``recipe`` from those prompts is cached."""
    target = Path(target)
    card = target / CARD
    # what made the target, not how long it took (a re-conversion keeps its draft)
    made = {k: v for k, v in json.loads(card.read_text()).items() if not k.endswith("_seconds")} \
        if card.exists() else target.name
    blob = "|".join([recipe.key(), prompts_key, json.dumps(made, sort_keys=True)])
    return target.parent / f"{target.name}-draft-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


# ------------------------------------------------------------------ prompts
def split_prompts(tokenizer, recipe: DraftRecipe, corpus=None) -> tuple[list[list[int]], list[list[int]], str]:
    """(training prompts, held-out prompts, their hash) as token ids in the target's chat
    format, from the corpus's draft split: suites taken in turn, each in a fixed hashed
    order, prompts over ``max_prompt_tokens`` skipped; held-out ones first."""
    corpus = corpus or load_corpus()
    chat = bool(getattr(tokenizer, "chat_template", None))

    def encode(text: str) -> list[int]:
        if chat:
            return list(tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                      tokenize=True, return_dict=True)["input_ids"])
        return list(tokenizer(text, add_special_tokens=True)["input_ids"])

    def fitting(q):  # the prompt's ids, where they fit the recipe
        ids = encode(q.prompt)
        return ids if len(ids) <= recipe.max_prompt_tokens else None

    want = recipe.train_prompts + recipe.held_out_prompts
    drawn = corpus.draft_questions("draft-order", want, fitting)
    out, ids_seen = [ids for _, ids in drawn], [q.id for q, _ in drawn]
    if len(out) < want:
        raise ValueError(f"the corpus's draft split has {len(out)} prompts of at most "
                         f"{recipe.max_prompt_tokens} tokens; the recipe wants {want}")
    key = hashlib.sha256("\n".join(ids_seen).encode()).hexdigest()[:16]
    held = recipe.held_out_prompts
    return out[held:], out[:held], key


# ------------------------------------------------------------------ teacher
def _eos_ids(model, tokenizer) -> set[int]:
    eos = model.generation_config.eos_token_id
    eos = eos if isinstance(eos, list) else [eos]
    return {e for e in [*eos, tokenizer.eos_token_id] if e is not None}


def teacher_answers(model, prompts: list[list[int]], recipe: DraftRecipe, eos: set[int],
                    dense: bool, states: bool = False, progress=None, label: str = "answers") -> list[tuple]:
    """The model's greedy answers to ``prompts``, batched (left-padded, KV-cached).

    Returns, per prompt, (prompt + answer ids, labels, states): ``labels[i]`` is the
    model's greedy token after position ``i`` (the answer's tokens along the answer;
    along the prompt, with ``dense``, the prefill's argmax, else -100) and, with
    ``dense`` and ``states``, ``states[i]`` the model's final (normed) hidden state there,
    which the lm_head turns into that token (else None). The answer stops at its first
    end-of-sequence token."""
    import torch  # lazy: torch is heavy
    from transformers import DynamicCache  # lazy: transformers pulls torch

    # newer transformers renamed past_key_values to cache
    cache_kw = "cache" if "cache" in inspect.signature(model.model.forward).parameters else "past_key_values"
    out = []
    task = progress.add_task(f"draft: target {label}", total=len(prompts)) if progress else None
    head = model.get_output_embeddings()
    with torch.inference_mode():
        for b in range(0, len(prompts), recipe.generate_batch):
            batch = prompts[b:b + recipe.generate_batch]
            width = max(map(len, batch))
            x = torch.zeros(len(batch), width, dtype=torch.long)
            mask = torch.zeros_like(x)
            for i, p in enumerate(batch):
                x[i, width - len(p):] = torch.tensor(p)
                mask[i, width - len(p):] = 1
            pos = (mask.cumsum(-1) - 1).clamp(min=0)
            cache = DynamicCache(config=model.config)
            h = model.model(input_ids=x, attention_mask=mask, position_ids=pos, use_cache=True,
                            **{cache_kw: cache}).last_hidden_state
            hidden = [[h[i, width - len(p):]] for i, p in enumerate(batch)] if dense and states else None
            prompt_labels = [head(h[i, width - len(p):]).argmax(-1).tolist() if dense else
                             [-100] * (len(p) - 1) + [int(head(h[i, -1]).argmax())]
                             for i, p in enumerate(batch)]
            nxt = torch.tensor([lab[-1] for lab in prompt_labels])
            answers = [[t] for t in nxt.tolist()]
            done = torch.tensor([t in eos for t in nxt.tolist()])
            last = pos[:, -1]
            for _ in range(recipe.answer_tokens - 1):
                if bool(done.all()):
                    break
                mask = torch.cat([mask, torch.ones(len(batch), 1, dtype=mask.dtype)], dim=1)
                last = last + 1
                h = model.model(input_ids=nxt[:, None], attention_mask=mask, position_ids=last[:, None],
                                use_cache=True, **{cache_kw: cache}).last_hidden_state[:, -1]
                nxt = head(h).argmax(-1)
                for i, t in enumerate(nxt.tolist()):
                    if not done[i]:
                        answers[i].append(t)
                        if hidden is not None:
                            hidden[i].append(h[i:i + 1])
                        done[i] = t in eos
            for i, (p, plab, ans) in enumerate(zip(batch, prompt_labels, answers)):
                # labels[j] predicts ids[j + 1]; the prompt's last position predicts ans[0]
                hs = torch.cat(hidden[i])[:len(p) + len(ans) - 1].to(torch.bfloat16) if hidden else None
                out.append((p + ans[:-1], plab[:-1] + ans, hs))
            if progress:
                progress.update(task, advance=len(batch))
    return out


# ------------------------------------------------------------------ draft
def init_draft(target, layers: tuple[int, ...]):
    """A model of the target's architecture with only ``layers`` of its decoder layers,
    every weight copied from the target (embeddings, lm_head, final norm, those layers)."""
    import torch  # lazy: torch is heavy
    from transformers import AutoModelForCausalLM  # lazy: transformers pulls torch

    n = target.config.num_hidden_layers
    if not layers or any(not 0 <= i < n for i in layers):
        raise ValueError(f"draft layers {layers}: the target has layers 0-{n - 1}")
    cfg = copy.deepcopy(target.config)
    cfg.num_hidden_layers = len(layers)
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = [cfg.layer_types[i] for i in layers]
    draft = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    renamed = {}
    for k, v in target.state_dict().items():
        if k.startswith("model.layers."):
            i = int(k.split(".")[2])
            if i in layers:
                renamed[k.replace(f"model.layers.{i}.", f"model.layers.{layers.index(i)}.", 1)] = v.clone()
        else:
            renamed[k] = v.clone()
    missing, unexpected = draft.load_state_dict(renamed, strict=False)
    missing = [k for k in missing if k != "lm_head.weight" or not cfg.tie_word_embeddings]
    if missing or unexpected:
        raise RuntimeError(f"draft init: missing {missing[:5]}, unexpected {unexpected[:5]}")
    draft.generation_config = copy.deepcopy(target.generation_config)
    return draft


def _batch(seqs, rows: list[int], recipe: DraftRecipe, rng: random.Random):
    """Right-padded ids, the target's hidden states, and the (row, position, label) triples
    taught by cross-entropy in this batch: every answer position, and
    ``prompt_positions`` sampled prompt positions per sequence."""
    import torch  # lazy: torch is heavy

    width = max(len(seqs[r][0]) for r in rows)
    x = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(x)
    hidden = seqs[rows[0]][3] is not None
    states = torch.zeros(len(rows), width, seqs[rows[0]][3].shape[-1] if hidden else 0, dtype=torch.bfloat16)
    bi, pi, lab = [], [], []
    for j, r in enumerate(rows):
        ids, labels, n_prompt, hs = seqs[r]
        x[j, :len(ids)] = torch.tensor(ids)
        mask[j, :len(ids)] = 1
        if hidden:
            states[j, :len(hs)] = hs
        taught = [i for i in range(len(labels)) if i >= n_prompt - 1 and labels[i] >= 0]
        prompt_pos = [i for i in range(n_prompt - 1) if labels[i] >= 0]
        taught += rng.sample(prompt_pos, min(recipe.prompt_positions, len(prompt_pos)))
        bi += [j] * len(taught)
        pi += taught
        lab += [labels[i] for i in taught]
    return x, mask, states, torch.tensor(bi), torch.tensor(pi), torch.tensor(lab)


def train_draft(draft, seqs, recipe: DraftRecipe, progress=None) -> dict:
    """Cross-entropy of the draft's next token on the target's greedy tokens (plus, with
    ``hidden_weight``, the distance to the target's final hidden states); the tied
    embeddings / lm_head stay frozen, the draft's layers and final norm learn."""
    import torch  # lazy: torch is heavy

    torch.manual_seed(recipe.seed)
    rng = random.Random(recipe.seed)
    draft.train()
    draft.get_input_embeddings().weight.requires_grad_(False)
    draft.get_output_embeddings().weight.requires_grad_(False)
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=recipe.lr, weight_decay=0.0, betas=(0.9, 0.98))
    sched = warmup_cosine(opt, recipe.steps)
    head = draft.get_output_embeddings()
    order: list[int] = []
    losses, t0, done = [], time.perf_counter(), 0
    task = progress.add_task("draft: distil", total=recipe.steps) if progress else None
    for step in range(recipe.steps):
        if len(order) < recipe.batch_size:
            perm = list(range(len(seqs)))
            rng.shuffle(perm)
            order += perm
        rows, order = order[:recipe.batch_size], order[recipe.batch_size:]
        x, mask, states, bi, pi, lab = _batch(seqs, rows, recipe, rng)
        amp = torch.autocast("cpu", dtype=torch.bfloat16) if recipe.train_bf16 else contextlib.nullcontext()
        with amp:
            h = draft.model(input_ids=x, attention_mask=mask).last_hidden_state
            logits = head(h[bi, pi]).float()
        loss = torch.nn.functional.cross_entropy(logits, lab)
        if recipe.hidden_weight:
            # every position: the draft's final hidden state towards the target's (the
            # frozen lm_head then gives the target's logits), no vocabulary-wide matmul
            diff = (h.float() - states.float())[mask.bool()]
            loss = loss + recipe.hidden_weight * diff.pow(2).mean()
        losses.append(apply_step(loss, params, opt, sched))
        done = step + 1
        if progress:
            progress.update(task, advance=1, description=f"draft: distil loss {losses[-1]:.2f}")
        if time.perf_counter() - t0 > recipe.train_time_cap_s:
            break
    draft.eval()
    for p in draft.parameters():
        p.requires_grad_(True)
    tail = losses[-10:]
    return {"steps": done, "steps_planned": recipe.steps, "first_loss": round(losses[0], 4),
            "final_loss": round(sum(tail) / len(tail), 4), "train_seconds": round(time.perf_counter() - t0, 1)}


def acceptance(draft, seqs) -> dict:
    """The fraction of answer positions where the draft's greedy token equals the target's
    (each sequence run whole, as speculative decoding's draft sees it)."""
    import torch  # lazy: torch is heavy

    agree = total = 0
    with torch.inference_mode():
        for ids, labels, n_prompt, _ in seqs:
            logits = draft(input_ids=torch.tensor([ids])).logits[0]
            pred = logits[n_prompt - 1:len(labels)].argmax(-1)
            want = torch.tensor(labels[n_prompt - 1:])
            agree += int((pred == want).sum())
            total += len(want)
    return {"acceptance_rate": round(agree / max(total, 1), 4), "positions": total}


# ------------------------------------------------------------------ build
#: torch threads for the build. One: on a 2-core machine shared with anything else, two
#: OpenMP threads wait on each other (a build on two threads beside other work: 681 s,
#: 31 of 120 training steps in their 120 s; one thread: about 1.3 s a step)
BUILD_THREADS = 1


def build_draft(target: Path, recipe: DraftRecipe | None = None, force: bool = False,
                progress=None, log=print, corpus=None, threads: int = BUILD_THREADS) -> BuiltDraft:
    """Distil (or reuse) a draft for the checkpoint folder ``target``; see the module doc.
    ``recipe`` None: :func:`default_recipe` for this CPU."""
    import torch  # lazy: torch is heavy
    from transformers import AutoTokenizer  # lazy: transformers pulls torch

    recipe = recipe or default_recipe()
    target = Path(target)
    tokenizer = AutoTokenizer.from_pretrained(target)
    train_p, held_p, prompts_key = split_prompts(tokenizer, recipe, corpus)
    folder = draft_folder(target, recipe, prompts_key)
    if (folder / CARD).exists() and not force:
        return BuiltDraft(folder, json.loads((folder / CARD).read_text()))
    before_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _build(target, folder, recipe, tokenizer, train_p, held_p, prompts_key, progress, log)
    finally:
        torch.set_num_threads(before_threads)


def _build(target: Path, folder: Path, recipe: DraftRecipe, tokenizer, train_p, held_p, prompts_key,
           progress, log) -> BuiltDraft:
    import torch  # lazy: torch is heavy
    import transformers  # lazy: transformers pulls torch
    from transformers import AutoModelForCausalLM  # lazy: transformers pulls torch

    t0 = time.perf_counter()
    torch.manual_seed(recipe.seed)
    log(f"distilling a {len(recipe.layers)}-layer speculative draft from {target.name} "
        f"(once; cached beside it): {len(train_p)} training and {len(held_p)} held-out prompts")
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    eos = _eos_ids(model, tokenizer)
    teacher = model if recipe.teacher_dtype == "float32" else \
        AutoModelForCausalLM.from_pretrained(target, dtype=getattr(torch, recipe.teacher_dtype)).eval()
    t_gen = time.perf_counter()
    train = [(ids, lab, len(p), states) for p, (ids, lab, states) in
             zip(train_p, teacher_answers(teacher, train_p, recipe, eos, dense=True,
                                             states=bool(recipe.hidden_weight), progress=progress))]
    held = [(ids, lab, len(p), None) for p, (ids, lab, _) in
            zip(held_p, teacher_answers(model, held_p, recipe, eos, dense=False, progress=progress,
                                        label="held-out answers (fp32)"))]
    gen_s = time.perf_counter() - t_gen
    log(f"draft: the target answered {len(train)} + {len(held)} prompts greedily "
        f"({sum(len(i) - n + 1 for i, _, n, _ in train + held)} answer tokens) in {gen_s:.0f} s")
    del teacher
    draft = init_draft(model, tuple(recipe.layers))
    before = acceptance(draft, held)
    stats = train_draft(draft, train, recipe, progress)
    log(f"draft: distilled {stats['steps']} steps in {stats['train_seconds']:.0f} s, loss "
        f"{stats['first_loss']:.2f} -> {stats['final_loss']:.2f}")
    after = acceptance(draft, held)
    weights = target / "model.safetensors"
    target_card = target / CARD
    card = {
        "model": "speculative draft",
        "target": {"folder": str(target), "name": target.name,
                   "model_safetensors_sha256": sha256_file(weights) if weights.exists() else None,
                   "card": json.loads(target_card.read_text()) if target_card.exists() else None},
        "recipe": asdict(recipe),
        "recipe_key": recipe.key(),
        "prompts": {"source": "dataset.prompt_corpus draft split (held out of profiles, studies and live "
                              "evaluation)", "key": prompts_key, "train": len(train), "held_out": len(held),
                    "train_answer_tokens": sum(len(ids) - n + 1 for ids, _, n, _ in train),
                    "held_out_answer_tokens": after["positions"]},
        "layers": list(recipe.layers),
        "draft_params": sum(p.numel() for p in draft.parameters()),
        "target_params": sum(p.numel() for p in model.parameters()),
        "train": stats,
        "final_loss": stats["final_loss"],
        "held_out_acceptance_rate_before_training": before["acceptance_rate"],
        "held_out_acceptance_rate": after["acceptance_rate"],
        "teacher_seconds": round(gen_s, 1),
        "dtype": {"teacher": recipe.teacher_dtype, "train": "bfloat16" if recipe.train_bf16 else "float32"},
        "steps_done": stats["steps"],
        "threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "build_seconds": round(time.perf_counter() - t0, 1),
    }
    card = json.loads(json.dumps(card))  # as a reader of the card will see it (tuples as lists)
    with atomic_folder(folder) as tmp:
        draft.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / CARD).write_text(json.dumps(card, indent=2))
    log(f"draft: {card['draft_params'] / 1e6:.1f} M parameters, held-out acceptance "
        f"{card['held_out_acceptance_rate']:.2f} (before distilling {before['acceptance_rate']:.2f}), "
        f"final loss {stats['final_loss']:.3f}, {card['build_seconds']:.0f} s: {folder}")
    return BuiltDraft(folder, card)
