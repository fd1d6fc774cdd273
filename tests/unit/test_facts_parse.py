"""Facts: parsing sections into values and absent reasons, and the catalog's snippets run
for real with sh on this machine (files, links, sysctls, torch)."""

from __future__ import annotations

import grp
import os
import platform
import pwd
import subprocess
import time
from pathlib import Path

import pytest

from gpufleet.connect.connection import CommandResult
from gpufleet.connect.local import LocalConnection
from gpufleet.errors import GpufleetError, ParseError
from gpufleet.facts import catalog
from gpufleet.facts import script as fscript
from gpufleet.facts.catalog import Fact
from gpufleet.facts.formats import FileDigest, FileState, file_state, link_target
from gpufleet.facts.gather import (
    FactMissing,
    FactRequest,
    Facts,
    gather_facts,
    parse_sections,
    snippet_timeout,
)
from gpufleet.inventory.model import Host

ROOT = Path(__file__).resolve().parents[2]
VENV_PYTHON = ROOT / ".venv" / "bin" / "python"


def run_composed(commands: list[tuple[str, str]]) -> str:
    """The composite script's output, run with sh as a host would."""
    proc = subprocess.run(["sh", "-c", fscript.compose(commands)], capture_output=True,
                          timeout=60, check=False)
    return proc.stdout.decode("utf-8", errors="replace")


def gather(facts: list[Fact]) -> Facts:
    """compose -> sh -> split -> parse, without SSH."""
    return parse_sections("local", run_composed([(f.name, f.shell) for f in facts]), facts)


def owner_of(path: Path) -> str:
    st = path.stat()
    return f"{pwd.getpwuid(st.st_uid).pw_name}:{grp.getgrgid(st.st_gid).gr_name}"


def _bad(text: str) -> str:
    raise ParseError(f"cannot read {text.strip()!r}")


# --------------------------------------------------------------------------- parse_sections


def test_values_and_absent_reasons() -> None:
    facts = [
        Fact("ok", "echo 42", catalog._int),
        Fact("missing-tool", catalog.needs("gpufleet-no-such-tool", "no such tool here")
             + "gpufleet-no-such-tool", str),
        Fact("quiet-failure", "exit 3", str),
        Fact("noisy-failure", "echo first; echo 'the last line says why'; exit 1", str),
        Fact("parse-error", "echo garbage", _bad),
        Fact("value-error", "echo abc", catalog._int),
    ]
    result = gather(facts)
    assert result.values == {"ok": 42}
    assert result.absent == {
        "missing-tool": "no such tool here",
        "quiet-failure": "exit status 3",
        "noisy-failure": "the last line says why",
        "parse-error": "unparseable output: cannot read 'garbage'",
        "value-error": "unparseable output: ValueError: invalid literal for int() with base 10: "
                       "'abc'",
    }


def test_rc_127_of_a_missing_command_gives_the_shells_message() -> None:
    result = gather([Fact("tool", "gpufleet-no-such-command --version", str)])
    assert result.values == {}
    assert "gpufleet-no-such-command" in result.absent["tool"]
    assert "not found" in result.absent["tool"]


def test_reason_is_cut_at_200_characters() -> None:
    result = gather([Fact("long", f"echo {'x' * 300}; exit 2", str)])
    assert result.absent == {"long": "x" * 200}


def test_a_section_missing_from_the_output_is_absent_with_a_reason() -> None:
    facts = [Fact("a", "echo 1", catalog._int), Fact("b", "echo 2", catalog._int)]
    output = run_composed([("a", "echo 1")])
    result = parse_sections("h1", output, facts)
    assert result.host == "h1"
    assert result.values == {"a": 1}
    assert result.absent == {"b": "no output (the facts script stopped early)"}


def test_sections_not_asked_for_are_ignored() -> None:
    result = parse_sections("h1", run_composed([("extra", "echo x")]), [])
    assert (result.values, result.absent) == ({}, {})


# --------------------------------------------------------------------------- Facts accessors


def test_require_names_the_reason_a_fact_is_missing() -> None:
    facts = Facts("h", values={"kernel": "6.8.0"}, absent={"gpus": "nvidia-smi not found"})
    assert facts.require("kernel") == "6.8.0"
    with pytest.raises(FactMissing, match=r"^fact 'gpus' is unknown: nvidia-smi not found$"):
        facts.require("gpus")
    with pytest.raises(FactMissing, match=r"^fact 'nope' is unknown: not gathered$"):
        facts.require("nope")
    assert facts.why_absent("gpus") == "nvidia-smi not found"
    assert facts.why_absent("nope") == "not gathered"


def test_package_is_none_unless_installed() -> None:
    facts = Facts("h", values={"packages": {
        "a": {"version": "1.0-1", "installed": True, "hold": False,
              "status": "install ok installed"},
        "b": {"version": "2.0-1", "installed": False, "hold": False,
              "status": "deinstall ok config-files"},
    }})
    assert facts.package("a") == {"version": "1.0-1", "installed": True, "hold": False,
                                  "status": "install ok installed"}
    assert facts.package("b") is None
    assert facts.package("c") is None


def test_cuda_version_prefers_version_json_over_nvcc() -> None:
    assert Facts("h", values={"cuda_version_json": "12.4.1", "nvcc": "12.4.131"}).cuda_version \
        == "12.4.1"
    assert Facts("h", values={"nvcc": "12.4.131"}).cuda_version == "12.4.131"
    assert Facts("h").cuda_version is None


# --------------------------------------------------------------------------- catalog: files


def test_file_fact_reads_mode_owner_and_exact_bytes(tmp_path: Path) -> None:
    path = tmp_path / "dir with space" / "it's a file.conf"
    path.parent.mkdir()
    content = b"line one\n\x00\x01\xfe\xff binary\r\n@@gpufleet-rc:0@@\nno trailing newline"
    path.write_bytes(content)
    path.chmod(0o640)
    result = gather([catalog.file_fact(str(path))])
    assert result.absent == {}
    assert result.file(str(path)) == FileState(str(path), True, content, "640", owner_of(path))


def test_file_fact_of_an_empty_file_and_a_missing_one(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    empty.chmod(0o600)
    missing = tmp_path / "missing"
    result = gather([catalog.file_fact(str(empty)), catalog.file_fact(str(missing))])
    assert result.file(str(empty)) == FileState(str(empty), True, b"", "600", owner_of(empty))
    assert result.file(str(missing)) == FileState(str(missing), False)


def test_file_fact_of_a_large_file_survives_base64_line_wrapping(tmp_path: Path) -> None:
    path = tmp_path / "big.bin"
    content = bytes(range(256)) * 64
    path.write_bytes(content)
    result = gather([catalog.file_fact(str(path))])
    assert result.file(str(path)).content == content


def test_file_state_parser_errors() -> None:
    with pytest.raises(ParseError, match=r"^expected 'present MODE OWNER' or 'missing' for /x, "
                                         r"got 'present 644'$"):
        file_state("/x", "present 644\n")
    with pytest.raises(ParseError, match=r"^bad base64 content for /x: "):
        file_state("/x", "present 644 root:root\nnot*base64\n")
    assert file_state("/x", "present 644 root:root\naGk=\n").text == "hi"


def test_file_state_text_replaces_invalid_utf8() -> None:
    assert FileState("/x", True, b"a\xffb").text == "a\ufffdb"


# --------------------------------------------------------------------------- catalog: links


def test_link_fact_literal_target_notlink_and_missing(tmp_path: Path) -> None:
    link = tmp_path / "cuda link"
    link.symlink_to("../it's cuda-12.4")  # relative and dangling: kept literally
    regular = tmp_path / "regular"
    regular.write_text("x")
    directory = tmp_path / "dir"
    directory.mkdir()
    missing = tmp_path / "missing"
    paths = [link, regular, directory, missing]
    result = gather([catalog.link_fact(str(p)) for p in paths])
    assert [result.link(str(p)) for p in paths] == ["../it's cuda-12.4", "", "", None]


def test_link_target_parser_rejects_other_text() -> None:
    with pytest.raises(ParseError, match=r"^expected '-> TARGET', 'notlink' or 'missing', "
                                         r"got 'readlink: oops'$"):
        link_target("readlink: oops\n")


# --------------------------------------------------------------------------- catalog: sysctl


def test_sysctl_fact_maps_dots_to_proc_sys_path() -> None:
    fact = catalog.sysctl_fact("net.ipv4.ip_local_port_range")
    assert fact.name == "sysctl:net.ipv4.ip_local_port_range"
    assert fact.shell == "cat /proc/sys/net/ipv4/ip_local_port_range"


def test_sysctl_fact_reads_the_live_value() -> None:
    live = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
    result = gather([catalog.sysctl_fact("net.ipv4.ip_local_port_range")])
    assert result.sysctl("net.ipv4.ip_local_port_range") == " ".join(live.split())


def test_sysctl_fact_of_an_unknown_key_is_absent() -> None:
    result = gather([catalog.sysctl_fact("net.gpufleet.no_such_key")])
    assert result.values == {}
    assert result.absent == {"sysctl:net.gpufleet.no_such_key":
                             "cat: /proc/sys/net/gpufleet/no_such_key: No such file or directory"}


def test_sysctl_fact_follows_sysctls_slash_convention_for_dotted_names() -> None:
    fact = catalog.sysctl_fact("net.ipv4.conf.eth0/100.rp_filter")
    assert fact.shell == "cat /proc/sys/net/ipv4/conf/eth0.100/rp_filter"


# --------------------------------------------------------------------------- catalog: torch


def test_torch_fact_probe_with_the_venv_python() -> None:
    python = str(VENV_PYTHON)
    result = gather([catalog.torch_fact(python)])
    assert result.absent == {}
    assert result.torch(python) == {"python": platform.python_version(), "torch": "2.13.0+cpu",
                                    "cuda": None, "nccl": None}


def test_torch_fact_without_the_python_says_so() -> None:
    python = "/nonexistent/gpufleet venv/bin/python"
    result = gather([catalog.torch_fact(python)])
    assert result.torch(python) is None
    assert result.why_absent(f"torch:{python}") == f"no python at {python}"


def test_torch_fact_with_a_python_that_lacks_torch(tmp_path: Path) -> None:
    # -S drops site-packages, so the venv's interpreter no longer finds torch.
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nexec {VENV_PYTHON} -S \"$@\"\n")
    python.chmod(0o755)
    result = gather([catalog.torch_fact(str(python))])
    assert result.torch(str(python)) is None
    assert result.why_absent(f"torch:{python}") == "ModuleNotFoundError: No module named 'torch'"


# --------------------------------------------------------------------------- requests


def test_packages_fact_shell_sorts_and_quotes_names() -> None:
    fact = catalog.packages_fact(["libnccl2", "cuda-toolkit-12-4", "a b"])
    assert fact.name == "packages"
    assert fact.shell == (
        "command -v dpkg-query >/dev/null 2>&1 || { echo 'no dpkg on this host (not "
        "Debian/Ubuntu)'; exit 127; }; dpkg-query -W -f='${Package}\\t${Version}\\t${Status}\\n' "
        "'a b' cuda-toolkit-12-4 libnccl2 2>/dev/null; true")


def test_fact_request_union_and_fact_order() -> None:
    a = FactRequest(packages=frozenset({"b"}), files=frozenset({"/z", "/a"}),
                    sysctls=frozenset({"k.x"}))
    b = FactRequest(packages=frozenset({"a"}), links=frozenset({"/l"}),
                    pythons=frozenset({"/p/python"}))
    both = a | b
    assert both == FactRequest(frozenset({"a", "b"}), frozenset({"/z", "/a"}),
                               frozenset({"/l"}), frozenset({"/p/python"}),
                               frozenset({"k.x"}))
    assert [f.name for f in both.facts()] == [
        "packages", "file:/a", "file:/z", "link:/l", "torch:/p/python", "sysctl:k.x"]
    assert FactRequest().facts() == []


def test_json_safe_summarises_file_states_and_sets() -> None:
    value = {"f": FileState("/x", True, b"abc", "644", "root:root"), "s": {"b", "a"},
             "t": (1, 2), "d": FileDigest("/y", True, "ab" * 32, 7, "600", "root:root")}
    assert catalog.json_safe(value) == {
        "f": {"path": "/x", "exists": True, "mode": "644", "owner": "root:root", "bytes": 3},
        "s": ["a", "b"], "t": [1, 2],
        "d": {"path": "/y", "exists": True, "mode": "600", "owner": "root:root", "bytes": 7,
              "sha256": "ab" * 32}}


# --------------------------------------------------------------------------- gather_facts


def local_host() -> Host:
    return Host("local", {"ansible_connection": "local"}, frozenset({"all"}))


def test_gather_facts_on_this_machine(tmp_path: Path) -> None:
    path = tmp_path / "nccl.conf"
    path.write_bytes(b"NCCL_DEBUG=WARN")
    path.chmod(0o644)
    conn = LocalConnection(local_host())
    facts = gather_facts(conn, FactRequest(files=frozenset({str(path)})))
    assert conn.round_trips == 1
    assert facts.host == "local"
    assert facts.values["kernel"] == os.uname().release
    assert facts.values["arch"] == os.uname().machine
    assert facts.values["boot_id"] == \
        Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    ssh = os.environ.get("SSH_CONNECTION", "").split()
    assert facts.values["ssh_client"] == (ssh[0] if ssh else None)
    assert facts.file(str(path)) == FileState(str(path), True, b"NCCL_DEBUG=WARN", "644",
                                              owner_of(path))
    every = {f.name for f in catalog.BASE_FACTS} | {f"file:{path}"}
    assert set(facts.values) | set(facts.absent) == every
    assert not set(facts.values) & set(facts.absent)
    if not any((Path(d) / "nvidia-smi").exists() for d in os.environ["PATH"].split(":")):
        assert facts.absent["gpus"] == catalog.NO_SMI


class _DeadConnection:
    host = local_host()
    round_trips = 0

    def run(self, command: str, *, timeout: float = 120.0, stdin: bytes | None = None,
            become: bool | None = None) -> CommandResult:
        return CommandResult(command, 255, "", "ssh: connect to host 10.0.0.9 port 22: "
                             "Connection refused\n", 0.1)

    def put(self, path: str, content: bytes, *, mode: int = 0o644, owner: str = "root:root",
            backup: bool = True) -> None:
        raise AssertionError("not used")

    def close(self) -> None:
        return None


def test_gather_facts_without_any_section_raises_with_the_detail() -> None:
    with pytest.raises(GpufleetError, match=r"^facts script produced no sections \(exit 255\): "
                                            r"ssh: connect to host 10\.0\.0\.9 port 22: "
                                            r"Connection refused$"):
        gather_facts(_DeadConnection())


def test_a_hung_tool_costs_only_its_facts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(catalog, "BASE_FACTS", [
        catalog.Fact("hostname", "hostname", lambda t: t.strip()),
        catalog.Fact("gpus", "sleep 30", lambda t: t, "nvidia-smi"),
        catalog.Fact("gpu_topology", "echo topo", lambda t: t, "nvidia-smi"),
        catalog.Fact("kernel", "uname -r", lambda t: t.strip())])
    host = Host("local", {"ansible_connection": "local", "gpufleet_fact_timeout": 1},
                frozenset({"all"}))
    start = time.monotonic()
    facts = gather_facts(LocalConnection(host))
    assert time.monotonic() - start < 6
    assert facts.values["hostname"] and facts.values["kernel"] == os.uname().release
    assert facts.absent["gpus"] == "nvidia-smi timed out after 1 s"
    assert facts.timeouts == {"gpus", "gpu_topology"}
    assert facts.timed_out("gpus") and not facts.timed_out("kernel")


def test_a_stopped_facts_script_keeps_the_facts_it_printed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(catalog, "BASE_FACTS", [
        catalog.Fact("hostname", "hostname", lambda t: t.strip()),
        catalog.Fact("stuck", "sleep 30", lambda t: t),
        catalog.Fact("kernel", "uname -r", lambda t: t.strip())])
    conn = LocalConnection(local_host())
    conn.budget.start(2)
    facts = gather_facts(conn)
    assert facts.values["hostname"]
    assert facts.absent["stuck"].startswith("no output (the facts script was stopped after ")
    assert facts.absent["kernel"] == facts.absent["stuck"]


@pytest.mark.parametrize("value", [0, -1, "soon", True])
def test_a_bad_fact_timeout_is_a_clear_error(value: object) -> None:
    host = Host("gpu01", {"gpufleet_fact_timeout": value}, frozenset({"all"}))
    with pytest.raises(GpufleetError, match=r"^host gpu01: variable gpufleet_fact_timeout must "
                                            r"be a positive number of seconds, got "):
        snippet_timeout(host)
