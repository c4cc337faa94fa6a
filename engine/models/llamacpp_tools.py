"""llama.cpp's own programs, built once from the source that llama-cpp-python ships on PyPI.

The llama.cpp backend (:mod:`modeswitch.engine.backends.llamacpp_backend`) runs every mode through
``llama-server``, and the GGUF artifacts (:mod:`modeswitch.engine.models.gguf`) are made by
llama.cpp's own ``convert_hf_to_gguf.py`` and ``llama-quantize``. PyPI serves no binary of
them, but llama-cpp-python's source package vendors all of llama.cpp; this module takes
that package (``pip download --no-binary``), builds the three programs with the machine's
cmake and a C++ compiler (``-march=native``: the build is cached per CPU), and keeps the
vendored tree for its conversion script and ``gguf-py``.

Where a user has a llama.cpp build of their own, ``$MODESWITCH_LLAMACPP`` names its folder
(holding ``llama-server`` and ``llama-quantize``, and ``convert_hf_to_gguf.py`` beside them
or in the folder above), and nothing is built.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from modeswitch.dataset.errors import InputError
from modeswitch.dataset.io import atomic_folder, sha256_file
from modeswitch.engine.hardware import cpu_isa, cpu_model
from modeswitch.engine.models.cache import CARD, default_cache_dir

PACKAGE = "llama-cpp-python"
VERSION = "0.3.36"
#: a user's own llama.cpp build (a folder with llama-server and llama-quantize)
TOOLS_ENV = "MODESWITCH_LLAMACPP"
#: the programs built; llama-bench is the bare engine the bench compares the backend with
PROGRAMS = ("llama-server", "llama-quantize", "llama-bench")
#: off: curl and OpenSSL (no downloads, loopback only), the web UI (its prebuilt assets
#: are fetched from a hub at configure time), tests and examples (minutes of build)
CMAKE_FLAGS = ("-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_CURL=OFF",
               "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
               "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_APP=OFF",
               "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DGGML_NATIVE=ON")
#: bump when the build changes what it writes (part of the cache key)
BUILDER = 1


@dataclass
class LlamaCppTools:
    """Where llama.cpp's programs and its conversion script are."""

    bin: Path
    source: Path
    card: dict

    def program(self, name: str) -> Path:
        path = self.bin / name
        if not path.exists():
            raise InputError(f"{path}: llama.cpp's {name} is missing; rebuild with "
                             f"`modeswitch model build --backend llamacpp --force`")
        return path

    @property
    def server(self) -> Path:
        return self.program("llama-server")

    @property
    def quantize(self) -> Path:
        return self.program("llama-quantize")

    @property
    def convert_script(self) -> Path:
        return self.source / "convert_hf_to_gguf.py"

    @property
    def version(self) -> str:
        return str(self.card.get("version", "unknown"))


def build_key() -> str:
    """What makes one build differ from another: the package version, the flags and the
    CPU's instruction sets (``-march=native`` code may not run on another CPU kind)."""
    blob = json.dumps([VERSION, BUILDER, CMAKE_FLAGS, platform.machine(), cpu_isa()])
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def tools_folder(cache_dir: Path | None = None) -> Path:
    return Path(cache_dir or default_cache_dir()) / "llama.cpp" / f"{PACKAGE}-{VERSION}-{build_key()}"


def _user_tools(folder: str) -> LlamaCppTools:
    root = Path(folder)
    if not (root / "llama-server").exists():
        raise InputError(f"${TOOLS_ENV}={folder}: no llama-server in that folder")
    source = next((p for p in (root, root.parent, root.parent.parent)
                   if (p / "convert_hf_to_gguf.py").exists()), root)
    return LlamaCppTools(root, source, {"version": "user build", "folder": str(root)})


def find_tools(cache_dir: Path | None = None) -> LlamaCppTools | None:
    """The built (or the user's) llama.cpp programs, or None when not built yet."""
    if os.environ.get(TOOLS_ENV):
        return _user_tools(os.environ[TOOLS_ENV])
    folder = tools_folder(cache_dir)
    if (folder / CARD).exists():
        return LlamaCppTools(folder / "bin", folder / "src", json.loads((folder / CARD).read_text()))
    return None


def build_tools(cache_dir: Path | None = None, force: bool = False, log=print,
                jobs: int | None = None) -> LlamaCppTools:
    """Build (or reuse) llama.cpp's programs from llama-cpp-python's source package."""
    found = None if force else find_tools(cache_dir)
    if found is not None:
        return found
    for tool in ("cmake", "c++"):
        if shutil.which(tool) is None:
            raise InputError(f"building llama.cpp needs {tool} on PATH (apt-get install cmake g++), "
                             f"or set ${TOOLS_ENV} to a folder holding a llama.cpp build")
    folder = tools_folder(cache_dir)
    t0 = time.perf_counter()
    jobs = jobs or os.cpu_count() or 1
    log(f"building llama.cpp from {PACKAGE} {VERSION}'s source package (once per CPU kind; "
        f"about 10 minutes on 2 cores)")
    with tempfile.TemporaryDirectory(prefix="llamacpp-") as tmp, atomic_folder(folder) as out:
        sdist = _download(Path(tmp), log)
        source = _extract(sdist, out / "src")
        build = Path(tmp) / "build"
        _run(["cmake", "-S", str(source), "-B", str(build), *CMAKE_FLAGS], "configure", log)
        _run(["cmake", "--build", str(build), "-j", str(jobs), "--target", *PROGRAMS], "build", log)
        (out / "bin").mkdir()
        for name in PROGRAMS:
            shutil.copy2(build / "bin" / name, out / "bin" / name)
        card = {
            "tool": "llama.cpp", "package": PACKAGE, "version": VERSION,
            "sdist": sdist.name, "sdist_sha256": sha256_file(sdist),
            "cmake_flags": list(CMAKE_FLAGS), "programs": list(PROGRAMS),
            "cpu": cpu_model(), "isa": cpu_isa(), "jobs": jobs,
            "build_seconds": round(time.perf_counter() - t0, 1),
        }
        (out / CARD).write_text(json.dumps(card, indent=2))
    log(f"llama.cpp built in {card['build_seconds']:.0f} s: {folder / 'bin'}")
    return LlamaCppTools(folder / "bin", folder / "src", card)


def _download(into: Path, log) -> Path:
    """llama-cpp-python's source package: ``$MODESWITCH_LLAMACPP_SDIST`` if set, else from
    the package index through pip."""
    given = os.environ.get("MODESWITCH_LLAMACPP_SDIST")
    if given:
        return Path(given)
    log(f"downloading {PACKAGE}=={VERSION} (source package, about 77 MB)")
    _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
          "--disable-pip-version-check", "-q", "-d", str(into), f"{PACKAGE}=={VERSION}"], "download", log)
    found = sorted(into.glob("llama_cpp_python-*.tar.gz"))
    if not found:
        raise InputError(f"pip downloaded no source package of {PACKAGE}=={VERSION} into {into}")
    return found[0]


def _extract(sdist: Path, dest: Path) -> Path:
    """The vendored llama.cpp tree of the source package, extracted into ``dest``."""
    marker = "/vendor/llama.cpp/"
    with tarfile.open(sdist) as tar:
        members = []
        for m in tar.getmembers():
            if marker in m.name and (m.isfile() or m.isdir()):
                m.name = m.name.split(marker, 1)[1]
                if m.name:
                    members.append(m)
        if not members:
            raise InputError(f"{sdist}: no vendor/llama.cpp tree in this source package")
        tar.extractall(dest, members=members, filter="data")
    return dest


def _run(cmd: list[str], step: str, log) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-20:])
        raise RuntimeError(f"llama.cpp {step} failed ({' '.join(cmd[:3])} ...):\n{tail}")
