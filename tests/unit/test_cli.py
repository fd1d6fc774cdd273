"""The gpufleet command as users and cron/systemd meet it: run as a real process
(``python -m gpufleet``, what the console script and the nightly unit run), from a
directory outside the checkout. Bad usage exits 2 with one line and no traceback, before
any host is contacted; an internal error exits 70; Ansible's flags work."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet import exitcodes
from tests.conftest import FIXTURES, ROOT

LOCAL = "all:\n  hosts:\n    here:\n      ansible_connection: local\n"


def gpufleet(*args: str, cwd: Path, env: dict[str, str] | None = None,
             code: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run the gpufleet command (or ``code`` before it, to inject a fault) in ``cwd``."""
    argv = [sys.executable, "-c", code, *args] if code else [sys.executable, "-m", "gpufleet",
                                                             *args]
    environment = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
    environment.update(env or {})
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120,
                          env=environment, check=False)


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A working directory that is no checkout, with a one-host local inventory beside it."""
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "hosts.yml").write_text(LOCAL)
    return work


def test_help_lists_the_commands_from_any_directory(outside: Path) -> None:
    done = gpufleet("--help", cwd=outside)
    assert done.returncode == 0, done.stderr
    for command in ("provision", "drift", "conformance", "bootstrap", "inventory", "facts",
                    "drift.schedule", "watch", "lab.up"):
        assert command in done.stdout
    assert "Exit codes: 0 success" in done.stdout
    assert "--pty" not in done.stdout  # invoke's shell-command options mean nothing here


@pytest.mark.parametrize(("args", "message"), [
    (["drift", "-i", "../hosts.yml", "--bogus"], "error: No idea what '--bogus' is!"),
    (["nosuch"], "error: No idea what 'nosuch' is!"),
    (["drift"], "error: no inventory given: use -i/--inventory NAME or PATH"),
    (["provision", "--check"], "error: no inventory given"),
    (["drift", "-i", "nowhere"], "error: inventory 'nowhere' not found; tried inventory/"),
    (["drift.schedule", "-i", "../hosts.yml", "--at", "25:00"],
     "error: --at must be HH:MM (24-hour), got '25:00'"),
    (["drift", "-i", "../hosts.yml", "--keep", "x"], "error: --keep must be a number, got 'x'"),
    (["drift", "-i", "../hosts.yml", "--keep", "0"], "error: --keep must be 1 or more, got 0"),
    (["facts", "-i", "../hosts.yml", "--forks", "many"],
     "error: --forks must be a number, got 'many'"),
    (["conformance", "-i", "../hosts.yml", "--suite", "nosuch"], "error: unknown suite(s) nosuch"),
    (["conformance", "-i", "../hosts.yml", "--pairs", "some"],
     "error: --pairs must be auto, all, ring or sample:K, got 'some'"),
    (["inventory", "-i", "../hosts.yml"],
     "error: inventory: give exactly one of --list, --graph or --host HOST"),
    # a drain flag that could not act on a host (no gpufleet_scheduler) is bad usage
    (["conformance", "-i", "../hosts.yml", "--drain-failed"],
     "error: --drain-failed: here names no scheduler, so nothing could be drained there; set "
     "gpufleet_scheduler: slurm, or leave them out with --limit"),
    (["drift", "-i", "../hosts.yml", "--drain-drifted"], "error: --drain-drifted: here names no "),
])
def test_bad_usage_exits_2_with_one_line(outside: Path, args: list[str], message: str) -> None:
    done = gpufleet(*args, cwd=outside)
    assert done.returncode == exitcodes.USAGE, done
    assert one_line(done.stderr).startswith(message), done.stderr
    assert done.stdout == ""


@pytest.mark.parametrize("flag", ["--json", "--junit", "--prometheus"])
def test_an_unwritable_output_is_refused_before_any_host_is_contacted(
        outside: Path, tmp_path: Path, flag: str) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "file").write_text("x")
    # a directory where a file is wanted, and a path under a regular file
    for target in (locked, locked / "file" / "report"):
        done = gpufleet("drift", "-i", "../hosts.yml", flag, str(target), "--report-dir",
                        str(tmp_path / "history"), cwd=outside)
        assert done.returncode == exitcodes.USAGE, done
        assert one_line(done.stderr).startswith(f"error: {flag} {target}: ")
        assert not (tmp_path / "history").exists()  # nothing ran, nothing was written


def test_an_unwritable_report_dir_is_refused_before_the_run(outside: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a directory")
    done = gpufleet("drift", "-i", "../hosts.yml", "--report-dir", str(blocker), cwd=outside)
    assert done.returncode == exitcodes.USAGE
    assert one_line(done.stderr) == f"error: --report-dir {blocker}: not a directory"


INJECT = """
import sys
from gpufleet import app, cli
def boom(*args, **kwargs):
    raise RuntimeError("injected\\ntoken=s3cret-value")
app.drift_cmd = boom
sys.argv = ["gpufleet", *sys.argv[1:]]
cli.main()
"""


def test_an_internal_error_exits_70_in_one_line_and_shows_the_traceback_at_vvv(
        outside: Path) -> None:
    done = gpufleet("drift", "-i", "../hosts.yml", cwd=outside, code=INJECT)
    assert done.returncode == exitcodes.INTERNAL == 70
    line = one_line(done.stderr)
    assert line.startswith("internal error at <string>:")
    assert "RuntimeError: injected\\x0atoken=********" in line  # redacted like every report
    assert line.endswith("(run with -vvv for the traceback)")
    verbose = gpufleet("drift", "-i", "../hosts.yml", "-vvv", cwd=outside, code=INJECT)
    assert verbose.returncode == 70
    assert "Traceback (most recent call last):" in verbose.stderr
    assert "s3cret-value" not in verbose.stderr


def test_json_to_stdout_is_the_document_and_nothing_else(outside: Path) -> None:
    done = gpufleet("facts", "-i", "../hosts.yml", "--json", "-", cwd=outside)
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["schema"] == "gpufleet.facts/1"
    assert document["hosts"]["here"]["status"] == "ok"
    assert "here" in done.stderr  # the table went to standard error
    assert not (outside / "-").exists()


def test_ansible_short_flags_and_list_hosts(tmp_path: Path) -> None:
    (tmp_path / "hosts.ini").write_text("[gpu]\ngpu0[1:4] ansible_connection=local\n"
                                        "[login]\nlogin01 ansible_connection=local\n")
    done = gpufleet("drift", "-i", "hosts.ini", "-l", "gpu*:!gpu03", "-f", "2", "--list-hosts",
                    cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "  hosts (3):\n    gpu01\n    gpu02\n    gpu04\n"


def test_verbose_logs_each_command_and_its_duration(outside: Path) -> None:
    quiet = gpufleet("facts", "-i", "../hosts.yml", cwd=outside)
    assert "gpufleet.connect INFO" not in quiet.stderr
    done = gpufleet("facts", "-i", "../hosts.yml", "-v", cwd=outside)
    assert done.returncode == 0, done.stderr
    assert " gpufleet.connect INFO here: " in done.stderr
    assert " -> exit 0 in " in done.stderr
    assert "gpufleet.connect DEBUG" not in done.stderr
    more = gpufleet("facts", "-i", "../hosts.yml", "-vv", cwd=outside)
    assert "gpufleet.connect DEBUG here: stdout:" in more.stderr


def test_names_are_looked_up_in_the_configured_inventory_directory(tmp_path: Path) -> None:
    shelf = tmp_path / "inventories"
    (shelf / "prod").mkdir(parents=True)
    (shelf / "prod" / "hosts.yml").write_text(LOCAL)
    work = tmp_path / "elsewhere"
    work.mkdir()
    by_env = gpufleet("drift", "-i", "prod", "--list-hosts", cwd=work,
                      env={"GPUFLEET_INVENTORY_DIR": str(shelf)})
    assert (by_env.returncode, by_env.stdout) == (0, "  hosts (1):\n    here\n"), by_env.stderr
    config = tmp_path / "gpufleet.yaml"
    config.write_text(f"gpufleet:\n  inventory_dir: {shelf}\n")
    by_file = gpufleet("-f", str(config), "drift", "-i", "prod", "--list-hosts", cwd=work)
    assert by_file.returncode == 0, by_file.stderr
    # ./inventory/ comes first
    (work / "inventory").mkdir()
    (work / "inventory" / "prod.ini").write_text("[gpu]\nlocal01 ansible_connection=local\n")
    first = gpufleet("drift", "-i", "prod", "--list-hosts", cwd=work,
                     env={"GPUFLEET_INVENTORY_DIR": str(shelf)})
    assert first.stdout == "  hosts (1):\n    local01\n"


def test_the_nightly_unit_runs_this_installation_on_the_resolved_inventory(
        outside: Path, tmp_path: Path) -> None:
    units = tmp_path / "units"
    done = gpufleet("drift.schedule", "-i", "../hosts.yml", "--at", "03:15", "--unit-dir",
                    str(units), cwd=outside)
    assert done.returncode == 0, done.stderr
    service = (units / "gpufleet-drift.service").read_text()
    assert (f"ExecStart={sys.executable} -m gpufleet drift --inventory "
            f"{(tmp_path / 'hosts.yml').resolve()}") in service
    assert "SuccessExitStatus=1 3\n" in service  # 2 and 70 stay failures


def test_the_checkout_tasks_are_the_same_collection() -> None:
    from gpufleet import cli

    tasks = subprocess.run([sys.executable, "-c",
                            "import tasks; print(sorted(tasks.ns.task_names))"],
                           cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert tasks.strip() == str(sorted(cli.namespace().task_names))


def test_inventory_list_matches_ansible_inventory(tmp_path: Path) -> None:
    real_world = FIXTURES / "inventories" / "real-world"
    oracle = json.loads((real_world / "oracle" / "hpc.json").read_text())["list"]
    done = gpufleet("inventory", "-i", str(real_world / "hpc"), "--list", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    listing = json.loads(done.stdout)
    assert {k: v for k, v in listing.items() if k != "_meta"} == {
        k: v for k, v in oracle.items() if k != "_meta"}
    assert listing["_meta"]["hostvars"] == oracle["_meta"]["hostvars"]


def test_inventory_renders_templates_and_redacts_secrets(tmp_path: Path) -> None:
    (tmp_path / "hosts.yml").write_text(
        "all:\n  vars:\n    site: Atlas\n    domain: \"{{ site | lower }}.example.net\"\n"
        "    ansible_become_password: hunter2-secret\n"
        "    mirror: https://ops:hunter2-secret@mirror.example.net/\n"
        "  children:\n    gpu:\n      hosts:\n        gpu01:\n")
    done = gpufleet("inventory", "-i", "hosts.yml", "--host", "gpu01", "--origins",
                    cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "hunter2" not in done.stdout
    shown = json.loads(done.stdout)
    assert shown["domain"] == {"value": "atlas.example.net", "origin": "hosts.yml:4"}
    assert shown["ansible_become_password"]["value"] == "********"
    assert shown["mirror"]["value"] == "https://ops:********@mirror.example.net/"
    graph = gpufleet("inventory", "-i", "hosts.yml", "--graph", cwd=tmp_path)
    assert graph.stdout == "@all:\n  |--@ungrouped:\n  |--@gpu:\n  |  |--gpu01\n"


def test_a_warning_reaches_the_terminal_as_one_line(outside: Path, tmp_path: Path) -> None:
    reports = tmp_path / "history"
    first = gpufleet("drift", "-i", "../hosts.yml", "--report-dir", str(reports), cwd=outside)
    assert first.returncode == 0, first.stderr
    [run] = reports.glob("*/drift-*.json")
    (run.parent / "drift-29991231T000000.000000Z.json").write_text("[]")
    done = gpufleet("drift", "-i", "../hosts.yml", "--report-dir", str(reports), cwd=outside)
    assert done.returncode == 0, done.stderr
    assert "warning: drift history " in done.stderr
    assert "is unusable and was left out: not a drift report (no 'hosts' mapping)" in done.stderr
