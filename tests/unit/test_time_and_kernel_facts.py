"""The time_sync and kernel_state facts: their readers on real captures of chronyc,
timedatectl, modinfo and dkms (tests/fixtures/published, sources in its README), and their
snippets run with sh on this machine, with stand-in tools where this machine has none."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from gpufleet.errors import ParseError
from gpufleet.facts import catalog, formats
from gpufleet.facts.parsers import kernel, timesync
from gpufleet.lab.boot import CHRONY_TRACKING
from gpufleet.roles.kernel import kernel_state_fact
from tests.conftest import FIXTURES, stand_in

PUBLISHED = FIXTURES / "published"


def _read(name: str) -> str:
    return (PUBLISHED / name).read_text()


# ---- chrony and systemd-timesyncd ---------------------------------------------------------

def test_chrony_4_3_synchronised_to_a_server_and_with_none_answering() -> None:
    synced = timesync.chronyc_tracking(_read("chronyc-n-tracking-4.3-debian12-loopback-server.txt"))
    assert synced == {"synchronised": True, "offset_s": pytest.approx(2.696e-6),
                      "leap": "Normal", "reference": "7F000001 (127.0.0.1)", "stratum": 9}
    alone = timesync.chronyc_tracking(_read("chronyc-n-tracking-4.3-debian12-unsynchronised.txt"))
    assert (alone["synchronised"], alone["leap"], alone["stratum"]) == \
        (False, "Not synchronised", 0)


def test_chronyc_without_a_daemon_is_refused_naming_what_it_said() -> None:
    with pytest.raises(ParseError, match="506 Cannot talk to daemon"):
        timesync.chronyc_tracking(_read("chronyc-n-tracking-4.3-debian12-no-daemon.txt"))


def test_timesyncd_status_of_systemd_245_with_a_second_off() -> None:
    status = timesync.timesync_status(
        _read("timedatectl-timesync-status-245.6-debian-systemd-16492.txt"))
    assert status == {"server": "(null) (3.debian.pool.ntp.org)", "leap": "normal",
                      "offset_s": pytest.approx(-1.087495), "delay_s": pytest.approx(2.15688),
                      "jitter_s": pytest.approx(2.300948), "packet_count": 620}


@pytest.mark.parametrize(("span", "seconds"), [
    ("+1.024ms", 0.001024), ("-1.087495s", -1.087495), ("+52us", 52e-6),
    ("-1min 3.5s", -63.5), ("+0", None)])
def test_systemd_time_spans(span: str, seconds: float | None) -> None:
    if seconds is None:
        with pytest.raises(ParseError, match="a time span"):
            timesync.timespan_s(span)
    else:
        assert timesync.timespan_s(span) == pytest.approx(seconds)


def test_time_sync_from_each_source() -> None:
    chrony = formats.time_sync("@chronyc\n" + _read("chronyc-tracking-omnios-2576.txt")
                               .split("\n", 1)[1])
    assert (chrony["source"], chrony["synchronised"]) == ("chrony", True)
    assert chrony["offset_s"] == pytest.approx(-7.810536861)
    assert formats.time_sync("@timedatectl\nNTPSynchronized=yes\nNTP=yes\n")["synchronised"]
    assert formats.time_sync("@timedatectl\nNTPSynchronized=no\nNTP=no\n") == {
        "source": "systemd", "synchronised": False, "offset_s": None, "server": None}


@pytest.mark.parametrize(("text", "message"), [
    ("NTPSynchronized=yes\n", "output before the first section"),
    ("@timedatectl\nNTP=yes\n", "NTPSynchronized must be yes or no, got None"),
    ("@chronyc\nLeap status : Normal\n", "a 'System time :' line"),
    ("@ntpq\n", "unexpected section"),
    ("@chronyc\nLeap status : Normal\n@timedatectl\nNTPSynchronized=yes\n",
     "expected one of @chronyc and @timedatectl"),
])
def test_time_sync_refuses_what_it_cannot_read(text: str, message: str) -> None:
    with pytest.raises(ParseError, match=message):
        formats.time_sync(text)


def _snippet(shell: str, path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", shell], capture_output=True, text=True, timeout=30,
                          check=False, env={**os.environ, "PATH": f"{path}:/usr/bin:/bin"})


def test_the_time_sync_snippet_reads_chrony_where_chronyd_answers(tmp_path: Path) -> None:
    capture = PUBLISHED / "chronyc-n-tracking-4.3-debian12-loopback-server.txt"
    stand_in(tmp_path, "chronyc", f'[ "$*" = "-n tracking" ] && exec cat {capture}\nexit 2\n')
    done = _snippet(catalog.TIME_SYNC, tmp_path)
    assert done.returncode == 0
    assert formats.time_sync(done.stdout)["offset_s"] == pytest.approx(2.696e-6)


@pytest.mark.skipif(Path("/run/systemd/system").is_dir(), reason="systemd runs here")
def test_without_chronyd_or_systemd_the_fact_is_absent_with_chronycs_words(
        tmp_path: Path) -> None:
    stand_in(tmp_path, "chronyc", "echo '506 Cannot talk to daemon'; exit 1\n")
    done = _snippet(catalog.TIME_SYNC, tmp_path)
    assert (done.returncode, done.stdout) == (127, "506 Cannot talk to daemon\n")
    os.unlink(tmp_path / "chronyc")
    done = _snippet(catalog.TIME_SYNC, tmp_path)
    assert (done.returncode, done.stdout) == (
        127, "no chronyd answers and systemd does not run on this host\n")


# ---- modinfo and dkms ---------------------------------------------------------------------

@pytest.mark.parametrize(("name", "filename", "release", "version"), [
    ("modinfo-nvidia-590.44.01-dkms-ubuntu-aikitoria-15.txt",
     "/lib/modules/6.8.0-90-generic/updates/dkms/nvidia.ko", "6.8.0-90-generic", "590.44.01"),
    ("modinfo-gdrdrv-dkms-ubuntu-gdrcopy-82.txt",
     "/lib/modules/4.15.0-58-generic/updates/dkms/gdrdrv.ko", "4.15.0-58-generic", "1.1"),
    ("modinfo-nvidia-430.40-manjaro-extramodules-optimus-manager-qt-27.txt",
     "/lib/modules/5.3.6-1-MANJARO/extramodules/nvidia.ko.gz", "5.3.6-1-MANJARO", "430.40"),
])
def test_modinfo_of_out_of_tree_modules(name: str, filename: str, release: str,
                                        version: str) -> None:
    fields = kernel.modinfo(_read(name))
    assert (fields["filename"], fields["version"]) == (filename, version)
    assert kernel.vermagic_release(fields["vermagic"]) == release
    assert isinstance(fields["parm"], list) and len(fields["parm"]) >= 2


def test_modinfo_joins_a_signatures_lines_and_refuses_its_error() -> None:
    fields = kernel.modinfo("filename:       /x.ko\nsignature:      30:65:02\n\t\t31:00\n"
                            "vermagic:       6.1.0-27-amd64 SMP\n")
    assert fields["signature"] == "30:65:0231:00"
    for name in ("modinfo-nvidia-not-found-cuda-smi-2.txt",
                 "modinfo-k-kernel-without-modules-kmod-30-debian12.txt"):
        with pytest.raises(ParseError, match="Module nvidia not found"):
            kernel.modinfo(_read(name))


def test_dkms_status_before_and_since_dkms_3() -> None:
    old = kernel.dkms_status(_read("dkms-status-2.x-nvidia-fedora-negativo17-56.txt"))
    assert [(m["module"], m["version"], m["kernel"], m["state"]) for m in old["modules"]] == [
        ("nvidia", "396.45", f"4.17.{k}.fc28.x86_64", "installed")
        for k in ("11-200", "12-200", "14-202")]
    new = kernel.dkms_status(_read("dkms-status-3.0.10-nvidia-535-rtl8852bu-7.txt"))
    assert [(m["module"], m["version"], m["kernel"], m["arch"]) for m in new["modules"]] == [
        ("nvidia", "535.86.05", "6.5.0-060500rc5-generic", "x86_64"),
        ("rtl8852bu", "1.19.3", "6.5.0-060500rc5-generic", "x86_64")]
    noted = kernel.dkms_status(_read("dkms-status-2.x-original-module-negativo17-56.txt"))
    assert noted["modules"][0]["note"] == "original_module exists"
    broken = kernel.dkms_status(_read(
        "dkms-status-2.x-error-and-original-module-negativo17-56.txt"))
    assert broken == {"modules": [], "notes": [
        "Error! Could not locate dkms.conf file.",
        "File: /var/lib/dkms/nvidia/390.48/source/dkms.conf does not exist."]}
    assert kernel.dkms_status("nvidia/580.95.05: added\n")["modules"] == [
        {"module": "nvidia", "version": "580.95.05", "kernel": None, "arch": None,
         "state": "added", "note": None}]
    with pytest.raises(ParseError, match="a state of added, built, installed"):
        kernel.dkms_status("nvidia/580.95.05, 6.8.0-45-generic, x86_64: broken\n")


def test_kernel_state_reads_each_kernels_modules() -> None:
    nvidia = "".join(line + "\n" for line in _read(
        "modinfo-nvidia-590.44.01-dkms-ubuntu-aikitoria-15.txt").splitlines()
        if line.split(":")[0] in ("filename", "version", "vermagic", "name"))
    state = formats.kernel_state(
        "@running 6.8.0-90-generic\n@boot 6.8.0-90-generic\n@boot 6.8.0-94-generic\n"
        "@headers 6.8.0-90-generic\n@module 6.8.0-90-generic nvidia\n" + nvidia
        + "@module 6.8.0-94-generic nvidia\n" + _read("modinfo-nvidia-not-found-cuda-smi-2.txt")
        + "@dkms\n" + _read("dkms-status-3.0.10-nvidia-535-rtl8852bu-7.txt"))
    assert state["running"] == "6.8.0-90-generic"
    assert (state["boot"], state["headers"]) == (
        ["6.8.0-90-generic", "6.8.0-94-generic"], ["6.8.0-90-generic"])
    assert state["modules"]["6.8.0-90-generic"]["nvidia"]["version"] == "590.44.01"
    assert state["modules"]["6.8.0-94-generic"]["nvidia"] == {
        "error": "modinfo: ERROR: Module nvidia not found."}
    assert len(state["dkms"]["modules"]) == 2
    for bad, message in [("@boot 6.8.0-90-generic\n", "no @running line"),
                         ("@running a\n@running b\n", "two @running lines"),
                         ("@running a\n@boot\n", "unexpected line"),
                         ("hello\n@running a\n", "outside a section")]:
        with pytest.raises(ParseError, match=message):
            formats.kernel_state(bad)


@pytest.mark.skipif(shutil.which("modinfo", path=os.environ["PATH"] + ":/usr/sbin:/sbin")
                    is None, reason="no kmod here")
def test_the_kernel_state_snippet_on_this_machine() -> None:
    """Every kernel installed here (in /boot) and the running one, asked for a module no
    machine of the tests has."""
    fact = kernel_state_fact(("gpufleet_no_such_module",))
    done = subprocess.run(["sh", "-c", fact.shell], capture_output=True, text=True, timeout=60,
                          check=False,
                          env={**os.environ, "PATH": os.environ["PATH"] + ":/usr/sbin:/sbin"})
    assert done.returncode == 0, done.stdout
    state = formats.kernel_state(done.stdout)
    assert state["running"] == os.uname().release
    assert set(state["modules"]) == {os.uname().release} | set(state["boot"])
    assert all(m["gpufleet_no_such_module"]["error"].startswith("modinfo: ERROR: Module ")
               for m in state["modules"].values())
    assert fact is kernel_state_fact(("gpufleet_no_such_module",))


def test_the_labs_chrony_report_is_the_capture() -> None:
    """Lab nodes' chronyc stand-in replays this machine's real chrony 4.3 report."""
    assert _read("chronyc-n-tracking-4.3-debian12-loopback-server.txt") == CHRONY_TRACKING
