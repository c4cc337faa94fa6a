"""The C kernel behind compiled routers: built once, loaded twice.

``native/kernels.c`` is compiled with the system C compiler against this Python's
headers and cached by source hash (``$MODESWITCH_CACHE/native``, else
``~/.cache/modeswitch/native``). The one shared object is both a CPython extension
(:func:`extension`: single decisions from request objects, one C call) and a ctypes
library (:func:`library`: registration, region-tree builds and batches, which release
the GIL). Nothing here knows about routers; :mod:`modeswitch.routers.compiler.packing` lays
models out for it and :mod:`modeswitch.routers.compiler.router` calls it.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sysconfig
import tempfile
from pathlib import Path

import numpy as np

from modeswitch.dataset.features import FEATURE_SET_A

#: one packed tree node, as the kernel's ``Node``: the split is ``bin[feature] <= threshold``
#: (an index into the feature's sorted cuts); the right child is ``left + 1``
NODE = np.dtype([("threshold", "<u2"), ("feature", "<u2"), ("left", "<i4")])
#: ctypes argument types for int32 and double arrays
I32 = ctypes.POINTER(ctypes.c_int32)
F64 = ctypes.POINTER(ctypes.c_double)
I64 = ctypes.POINTER(ctypes.c_longlong)

_SRC = Path(__file__).parent / "native" / "kernels.c"
_LIB = None
_EXT = None


def _cache_dir() -> Path:
    env = os.environ.get("MODESWITCH_CACHE")
    return (Path(env) if env else Path.home() / ".cache" / "modeswitch") / "native"


def _build() -> Path:
    src = _SRC.read_bytes()
    include = sysconfig.get_paths()["include"]
    tag = hashlib.sha256(src + include.encode()).hexdigest()[:12]
    out = _cache_dir() / f"kernels-{tag}{sysconfig.get_config_var('EXT_SUFFIX') or '.so'}"
    if not out.exists():
        cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
        if cc is None:
            raise RuntimeError("compiled routers need a C compiler (cc/gcc) on PATH; "
                               "use the uncompiled router instead (--no-compile)")
        if not Path(include, "Python.h").exists():
            raise RuntimeError(f"compiled routers need Python's C headers (Python.h not in {include}); "
                               "install the python3-dev package or use --no-compile")
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
            tmp_so = Path(tmp) / "k.so"
            res = subprocess.run([cc, "-O3", "-shared", "-fPIC", f"-I{include}", "-o", str(tmp_so),
                                  str(_SRC), "-lm"], capture_output=True, text=True)
            if res.returncode:
                raise RuntimeError(f"building {_SRC} failed:\n{res.stderr}")
            os.replace(tmp_so, out)
    return out


def extension():
    """The kernel as a CPython extension module (single decisions from request objects)."""
    global _EXT
    if _EXT is None:
        path = _build()
        loader = importlib.machinery.ExtensionFileLoader("_modeswitch_kernels", str(path))
        spec = importlib.util.spec_from_file_location("_modeswitch_kernels", str(path), loader=loader)
        mod = importlib.util.module_from_spec(spec)
        loader.exec_module(mod)
        _EXT = mod
    return _EXT


def library():
    """Build (once, cached by source hash) and load the C kernel through ctypes."""
    global _LIB
    if _LIB is not None:
        return _LIB
    extension()  # one build, one load: the extension and ctypes share the model table
    lib = ctypes.CDLL(str(_build()))  # releases the GIL during calls: batches, region builds
    # the model table changes under the GIL only (registration here, release when a
    # router object is garbage), so two threads compiling at once cannot race
    lib.register_model = ctypes.PyDLL(str(_build())).register_model
    lib.release_model.restype = None
    lib.release_model.argtypes = [ctypes.c_int]
    lib.register_model.restype = ctypes.c_int
    lib.register_model.argtypes = [ctypes.c_int] * 9 + [ctypes.c_void_p, F64, I32, I32, I32, I32,
                                                          F64, I32, I32, F64, F64, F64]
    lib.set_output_ranges.restype = ctypes.c_int
    lib.set_output_ranges.argtypes = [ctypes.c_int, I32]
    lib.set_cost_decision.restype = ctypes.c_int
    lib.set_cost_decision.argtypes = [ctypes.c_int] * 4 + [ctypes.c_double] * 2
    lib.set_content.restype = ctypes.c_int
    lib.set_content.argtypes = [ctypes.c_int, F64, ctypes.c_long] + [ctypes.c_int] * 4 + [I32]
    lib.content_features.restype = ctypes.c_int
    lib.content_features.argtypes = [ctypes.c_int, I64, ctypes.c_long, F64, I64]
    lib.shape_features.restype = None
    lib.shape_features.argtypes = [ctypes.c_double] * 5 + [F64]
    lib.build_region.restype = ctypes.c_long
    lib.build_region.argtypes = [ctypes.c_int, ctypes.c_long, ctypes.c_long, F64, ctypes.c_long]
    lib.region_walk_share.restype = ctypes.c_double
    lib.region_walk_share.argtypes = [ctypes.c_int]
    lib.region_hits.restype = ctypes.c_long
    lib.region_hits.argtypes = [ctypes.c_int, F64, ctypes.c_long]
    lib.predict_batch.restype = None
    lib.predict_batch.argtypes = [ctypes.c_int, F64, ctypes.c_long, I32]
    if lib.node_size() != NODE.itemsize:
        raise RuntimeError(f"kernel node layout ({lib.node_size()} bytes) differs from {NODE}")
    _LIB = lib
    return lib


def pointer(a, kind):
    """An array's data as a ctypes pointer of ``kind`` (NULL for None)."""
    return a.ctypes.data_as(kind) if a is not None else ctypes.cast(None, kind)


def kernel_shape_features(p, o, sp, cc, mp) -> tuple:
    """Feature set A as the C kernel computes it from a request's raw numbers (what its
    single decisions read); tested against :data:`modeswitch.dataset.features.FEATURE_FORMULAS`."""
    out = np.empty(len(FEATURE_SET_A), dtype=np.float64)
    library().shape_features(float(p), float(o), float(sp), float(cc), float(mp), pointer(out, F64))
    return tuple(float(v) for v in out)
