"""Build the project's stdlib-trained model and its draft: the test suite's fast fixture
(``--model tiny``); the default model is SmolLM2-135M-Instruct (:mod:`modeswitch.engine.models.smollm2`).

No model hub is reachable, so this small model is made here: a
byte-level BPE tokenizer and a small Llama-architecture causal LM (the target),
plus a smaller draft sharing the tokenizer, trained with a fixed seed and step
count on the Python standard library's sources. They are saved as ordinary
Hugging Face checkpoint folders in a cache directory keyed by the recipe's hash
and reused when present.

Training must really happen: random weights give near-flat logits, so any
quantization flips outputs and a draft never agrees with the target. The build
reports the final loss and the draft's acceptance rate against the target (the
fraction of held-out positions where the draft's greedy token equals the
target's, which is the per-token acceptance probability of greedy speculative
decoding).
"""

from __future__ import annotations

import hashlib
import json
import platform
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from modeswitch.dataset.io import atomic_folder
from modeswitch.engine.models.cache import CARD, default_cache_dir
from modeswitch.engine.models.optimise import apply_step, warmup_cosine
from modeswitch.engine.models.tiny_corpus import corpus_hash, stdlib_text


@dataclass(frozen=True)
class ArchConfig:
    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    max_position_embeddings: int = 4096


@dataclass(frozen=True)
class BuildRecipe:
    """Everything that determines the built models (hashed into the cache key)."""

    # ``--model tiny``'s sizes: a build of under a minute on 2 cores. The training steps
    # are nearly all of its compute (the vocabulary's output layer and softmax a large
    # part of each step), so the model, vocabulary and step counts are kept small; the
    # corpus holds about as many tokens as the target's steps read, since tokenizing
    # text that no step reaches costs seconds for nothing
    vocab_size: int = 1024
    corpus_bytes: int = 1_000_000
    seq_len: int = 128
    batch_size: int = 16
    lr: float = 4e-3
    seed: int = 0
    target: ArchConfig = field(default_factory=lambda: ArchConfig(128, 2, 352, 2))
    target_steps: int = 150
    draft: ArchConfig = field(default_factory=lambda: ArchConfig(64, 1, 176, 2))
    draft_steps: int = 150
    #: stop a stage early if it runs this long (recorded in the card); None: never. Off by
    #: default: a capped stage trains a model that depends on the machine's load, under a
    #: cache key that does not say so (the test fixture's target stopped at 103 of 150
    #: steps while a study trained beside it; the one test that failed only under load
    #: reads that model's confidence)
    stage_time_cap_s: float | None = None

    def key(self) -> str:
        blob = json.dumps(asdict(self), sort_keys=True) + platform.python_version()
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


#: The test suite's recipe: ``--model tiny``'s code path and model sizes, with a smaller
#: vocabulary and corpus and a shorter context.
TEST_RECIPE = BuildRecipe(
    vocab_size=512, corpus_bytes=400_000, seq_len=128, batch_size=16, lr=4e-3,
    target=ArchConfig(128, 2, 352, 2, 2048), target_steps=150,
    draft=ArchConfig(64, 1, 176, 2, 2048), draft_steps=150,
)


@dataclass
class BuiltModels:
    target: Path
    draft: Path
    card: dict


def _train_tokenizer(text: str, vocab_size: int):
    # lazy: tokenizers comes with transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast  # lazy: transformers pulls torch

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator([text[i:i + 100_000] for i in range(0, len(text), 100_000)], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>", unk_token=None)


def _llama(arch: ArchConfig, tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM  # lazy: transformers pulls torch

    cfg = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=arch.hidden_size,
        intermediate_size=arch.intermediate_size, num_hidden_layers=arch.num_hidden_layers,
        num_attention_heads=arch.num_attention_heads, num_key_value_heads=arch.num_attention_heads,
        max_position_embeddings=arch.max_position_embeddings, tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return LlamaForCausalLM(cfg)


def _train(model, stream, recipe: BuildRecipe, steps: int, label: str, progress=None) -> dict:
    import torch  # lazy: torch is heavy

    g = torch.Generator().manual_seed(recipe.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=0.01, betas=(0.9, 0.95))
    sched = warmup_cosine(opt, steps)
    model.train()
    n = len(stream) - recipe.seq_len - 1
    start, losses, done = time.perf_counter(), [], 0
    task = progress.add_task(f"train {label}", total=steps) if progress else None
    for step in range(steps):
        idx = torch.randint(0, n, (recipe.batch_size,), generator=g)
        batch = torch.stack([stream[i:i + recipe.seq_len] for i in idx.tolist()])
        losses.append(apply_step(model(input_ids=batch, labels=batch).loss, model.parameters(), opt, sched))
        done = step + 1
        if progress:
            progress.update(task, advance=1, description=f"train {label} loss {losses[-1]:.2f}")
        if recipe.stage_time_cap_s is not None and time.perf_counter() - start > recipe.stage_time_cap_s:
            break
    model.eval()
    tail = losses[-10:]
    return {"steps": done, "steps_planned": steps, "final_train_loss": sum(tail) / len(tail),
            "train_seconds": round(time.perf_counter() - start, 1),
            "tokens_seen": done * recipe.batch_size * recipe.seq_len}


def _eval(target, draft, stream, recipe: BuildRecipe, n_windows: int = 8) -> dict:
    """Held-out loss of both models and the draft's greedy agreement with the target."""
    import torch  # lazy: torch is heavy

    g = torch.Generator().manual_seed(recipe.seed + 1)
    n = len(stream) - recipe.seq_len - 1
    idx = torch.randint(0, n, (n_windows,), generator=g)
    batch = torch.stack([stream[i:i + recipe.seq_len] for i in idx.tolist()])
    with torch.inference_mode():
        t_out = target(input_ids=batch, labels=batch)
        d_out = draft(input_ids=batch, labels=batch)
        t_top = t_out.logits.argmax(-1)
        agree = (d_out.logits.argmax(-1) == t_top).float().mean().item()
        top2 = t_out.logits.topk(2, dim=-1).values
        gap = (top2[..., 0] - top2[..., 1]).median().item()
    return {"target_eval_loss": round(t_out.loss.item(), 4), "draft_eval_loss": round(d_out.loss.item(), 4),
            "draft_acceptance_rate": round(agree, 4), "target_median_top1_top2_logit_gap": round(gap, 3)}


#: torch threads for the build, as for SmolLM2's draft: one. These matrices are small, so
#: a second thread gains little on an idle machine, and on a 2-core machine shared with
#: anything else two OpenMP threads wait on each other and the build runs several times
#: slower. The models are the same on any thread count.
BUILD_THREADS = 1


def build_models(cache_dir: Path | None = None, recipe: BuildRecipe = BuildRecipe(),
                 force: bool = False, progress=None, log=print,
                 threads: int = BUILD_THREADS) -> BuiltModels:
    """Build (or reuse) the default target and draft models; return their folders."""
    import torch  # lazy: torch is heavy

    cache_dir = Path(cache_dir or default_cache_dir()) / "models" / f"tiny-{recipe.key()}"
    card_path = cache_dir / CARD
    if card_path.exists() and not force:
        return BuiltModels(cache_dir / "target", cache_dir / "draft", json.loads(card_path.read_text()))
    before_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _build(cache_dir, recipe, progress, log)
    finally:
        torch.set_num_threads(before_threads)


def _build(cache_dir: Path, recipe: BuildRecipe, progress, log) -> BuiltModels:
    import torch  # lazy: torch is heavy

    target_dir, draft_dir = cache_dir / "target", cache_dir / "draft"
    torch.manual_seed(recipe.seed)
    t0 = time.perf_counter()
    text = stdlib_text(recipe.corpus_bytes)
    log(f"corpus: {len(text) / 1e6:.1f} MB of Python {platform.python_version()} stdlib sources")
    tokenizer = _train_tokenizer(text, recipe.vocab_size)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    stream = torch.tensor(ids, dtype=torch.long)
    split = int(len(stream) * 0.95)
    train, held = stream[:split], stream[split:]
    log(f"tokenizer: {len(tokenizer)} tokens; corpus {len(stream)} tokens "
        f"({time.perf_counter() - t0:.1f} s)")

    target = _llama(recipe.target, tokenizer)
    draft = _llama(recipe.draft, tokenizer)
    t_stats = _train(target, train, recipe, recipe.target_steps, "target", progress)
    d_stats = _train(draft, train, replace(recipe, seed=recipe.seed + 7), recipe.draft_steps,
                     "draft", progress)
    ev = _eval(target, draft, held, recipe)
    card = {
        "recipe_key": recipe.key(),
        "recipe": asdict(recipe),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "corpus_sha256_16": corpus_hash(text),
        "target_params": sum(p.numel() for p in target.parameters()),
        "draft_params": sum(p.numel() for p in draft.parameters()),
        "target": t_stats,
        "draft": d_stats,
        **ev,
        "build_seconds": round(time.perf_counter() - t0, 1),
    }
    with atomic_folder(cache_dir) as tmp:
        for d, m in ((tmp / "target", target), (tmp / "draft", draft)):
            m.generation_config.pad_token_id = tokenizer.pad_token_id
            m.save_pretrained(d)
            tokenizer.save_pretrained(d)
        (tmp / CARD).write_text(json.dumps(card, indent=2))
    return BuiltModels(target_dir, draft_dir, card)
