"""Every profile row says which CPU, and which caches, it was measured on."""

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
    assert hardware.hardware_string("cpu") == "Some CPU (2 cores; L2 1024K, L3 32768K)"
    monkeypatch.setattr(hardware, "cpu_caches", lambda: [])
    assert hardware.hardware_string("cpu") == "Some CPU (2 cores)"
