"""Every profile row says which CPU, which caches and which vector instruction sets it
was measured on; two lines tell whether they name one kind of machine."""

from modeswitch.engine import hardware


def test_caches_are_read_from_sysfs_in_index_order(tmp_path):
    for i, (level, kind, size) in enumerate([(1, "Data", "48K"), (1, "Instruction", "32K"),
                                             (2, "Unified", "1024K"), (3, "Unified", "32768K")]):
        d = tmp_path / f"index{i}"
        d.mkdir()
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")
    assert hardware.cpu_caches(tmp_path) == ["L1d 48K", "L1i 32K", "L2 1024K", "L3 32768K"]
    assert hardware.cpu_caches(tmp_path / "absent") == []


def test_the_cpu_line_names_the_model_the_cores_and_the_caches(monkeypatch):
    monkeypatch.setattr(hardware, "cpu_model", lambda: "Some CPU")
    monkeypatch.setattr(hardware, "cpu_caches", lambda: ["L2 1024K", "L3 32768K"])
    monkeypatch.setattr(hardware.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(hardware, "cpu_isa", lambda: [])
    assert hardware.hardware_string("cpu") == "Some CPU (2 cores; L2 1024K, L3 32768K)"
    monkeypatch.setattr(hardware, "cpu_caches", lambda: [])
    assert hardware.hardware_string("cpu") == "Some CPU (2 cores)"
    monkeypatch.setattr(hardware, "cpu_isa", lambda: ["avx2", "avx512f"])
    assert hardware.hardware_string("cpu") == "Some CPU (2 cores; isa avx2, avx512f)"


CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC
flags\t\t: fpu sse2 avx avx2 fma avx512f avx512bw avx512_bf16 avx512_vnni
processor\t: 1
flags\t\t: fpu sse2
"""


def test_the_instruction_sets_are_read_from_cpuinfo_in_a_fixed_order():
    assert hardware.cpu_isa(CPUINFO) == ["avx2", "avx512f", "avx512_vnni", "avx512_bf16"]
    assert hardware.cpu_isa("Features\t: fp asimd evtstrm sve\n") == ["asimd", "sve"]  # Arm
    assert hardware.cpu_isa("") == []


def test_two_lines_are_one_kind_when_model_cores_caches_and_named_instruction_sets_agree():
    zen4 = "AMD EPYC (2 cores; L1d 32K, L1i 32K, L2 1024K, L3 32768K; isa avx2, avx512f)"
    zen3 = "AMD EPYC (2 cores; L1d 32K, L1i 32K, L2 512K, L3 32768K; isa avx2)"
    assert hardware.same_kind(zen4, zen4)
    assert not hardware.same_kind(zen4, zen3)  # caches and instruction sets differ
    assert not hardware.same_kind(zen4, zen4.replace("isa avx2, avx512f", "isa avx2"))
    assert not hardware.same_kind(zen4, zen4.replace("2 cores", "4 cores"))
    # a line from before instruction sets were recorded is matched on the rest
    assert hardware.same_kind(zen4, "AMD EPYC (2 cores; L1d 32K, L1i 32K, L2 1024K, L3 32768K)")
    assert not hardware.same_kind(zen3, "AMD EPYC (2 cores; L1d 32K, L1i 32K, L2 1024K, L3 32768K)")
    assert hardware.same_kind("NVIDIA A100 40GB", "NVIDIA A100 40GB")
