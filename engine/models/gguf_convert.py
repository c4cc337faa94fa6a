"""Run llama.cpp's ``convert_hf_to_gguf.py`` on a checkpoint folder (a subprocess entry).

    python gguf_convert.py LLAMACPP_SOURCE MODEL_FOLDER OUTFILE OUTTYPE

The converter names each BPE tokenizer's pre-tokenizer by a hash of how it splits a
test string, and refuses a tokenizer it does not know. The project's own test model
trains a byte-level BPE tokenizer of its own, which no table knows. The backend gives
llama.cpp token ids, never text (prompts are tokenized, and answers decoded, by the
checkpoint's Hugging Face tokenizer), so the pre-tokenizer the GGUF names is never
used: an unknown one is written as llama.cpp's ``default`` and said on stderr.
Every other tokenizer converts exactly as the script converts it.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str]) -> None:
    source, model, outfile, outtype = argv
    sys.path[:0] = [source, str(Path(source) / "gguf-py")]
    from conversion import base  # the vendored converter, on the path just set

    known = base.TextModel.get_vocab_base_pre

    def vocab_base_pre(self, tokenizer):
        try:
            return known(self, tokenizer)
        except NotImplementedError:
            print("gguf_convert: pre-tokenizer not in llama.cpp's table; written as 'default' "
                  "(the backend sends token ids)", file=sys.stderr)
            return "default"

    base.TextModel.get_vocab_base_pre = vocab_base_pre
    sys.argv = ["convert_hf_to_gguf.py", model, "--outfile", outfile, "--outtype", outtype]
    import convert_hf_to_gguf  # the vendored script, on the path just set

    convert_hf_to_gguf.main()


if __name__ == "__main__":
    main(sys.argv[1:])
