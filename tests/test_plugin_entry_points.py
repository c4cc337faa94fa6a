"""Plug-ins the Python way: an installed package's ``modeswitch.plugins`` entry point.

A tiny plug-in distribution (its module and a ``.dist-info`` folder with
``entry_points.txt``, what ``pip install`` leaves in site-packages) is written into a
temporary site folder. Put on the path, its router family is registered without
``$MODESWITCH_PLUGINS``: in this process, and in a fresh one that only asks the router
registry for its names, as the CLI does.
"""

import os
import subprocess
import sys
import textwrap

import pytest

from modeswitch.dataset import registry as reg
from tests.conftest import REPO

PLUGIN = '''
"""A fixed-mode router family from an installed package."""
from modeswitch.routers.reference import FixedModeRouter
from modeswitch.routers.registry import RouterFamily, register_router

CALLS = []


def register():
    CALLS.append(1)
    register_router(RouterFamily("ep_fixed", FixedModeRouter, "a fixed mode (an entry-point plug-in)",
                                 learned=False))
'''

BROKEN = '''
raise RuntimeError("this plug-in is broken")
'''


def _site(tmp_path, entry_points: str, **modules: str):
    """A site folder holding ``modules`` and one installed distribution, ``eplab``,
    whose entry points are ``entry_points`` (the text pip writes to entry_points.txt)."""
    site = tmp_path / "site"
    dist = site / "eplab-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: eplab\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(textwrap.dedent(entry_points))
    for name, source in modules.items():
        (site / f"{name}.py").write_text(textwrap.dedent(source))
    return site


@pytest.fixture
def clean_plugins(monkeypatch):
    """Forget which entry points were loaded, and the plug-in's registration, afterwards."""
    from modeswitch.routers.registry import ROUTERS

    monkeypatch.delenv(reg.PLUGINS_ENV, raising=False)
    monkeypatch.setattr(reg, "_loaded_entry_points", set())
    yield
    ROUTERS.unregister("ep_fixed")
    for name in ("eplab_routers", "eplab_broken"):
        sys.modules.pop(name, None)


def test_an_installed_entry_point_plugin_is_registered(tmp_path, monkeypatch, clean_plugins):
    from modeswitch.routers import get_router, list_routers

    site = _site(tmp_path, """
        [modeswitch.plugins]
        fixed = eplab_routers:register
    """, eplab_routers=PLUGIN)
    monkeypatch.syspath_prepend(str(site))

    assert reg.load_entry_point_plugins() == ["fixed"]
    assert "ep_fixed" in list_routers()
    assert get_router("ep_fixed", mode="int8_quant").fit(None).mode_ == "int8_quant"
    # loaded once: every registry calls import_plugins on first lookup
    reg.import_plugins()
    reg.import_plugins()
    assert sys.modules["eplab_routers"].CALLS == [1]


def test_a_fresh_process_finds_the_plugin_through_the_registry(tmp_path):
    site = _site(tmp_path, """
        [modeswitch.plugins]
        fixed = eplab_routers:register
    """, eplab_routers=PLUGIN)
    env = {k: v for k, v in os.environ.items() if k != reg.PLUGINS_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(REPO)])
    out = subprocess.run([sys.executable, "-c", "from modeswitch.routers import list_routers; print(list_routers())"],
                         env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "ep_fixed" in out.stdout


def test_a_broken_plugin_is_skipped_with_a_warning_naming_it(tmp_path, monkeypatch, clean_plugins):
    site = _site(tmp_path, """
        [modeswitch.plugins]
        broken = eplab_broken
        fixed = eplab_routers:register
    """, eplab_routers=PLUGIN, eplab_broken=BROKEN)
    monkeypatch.syspath_prepend(str(site))

    with pytest.warns(RuntimeWarning, match="'broken' .*this plug-in is broken"):
        loaded = reg.load_entry_point_plugins()
    assert loaded == ["fixed"]  # the others still load
