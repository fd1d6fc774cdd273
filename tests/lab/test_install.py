"""gpufleet as a platform engineer installs it on a controller that is no checkout: the
wheel built from this tree, installed into a fresh virtual environment (its dependencies
from the wheelhouse scripts/setup keeps, no network), then run from a directory outside the
checkout against the session lab; the JSON Schemas ship in it and validate what the
installed command writes. pipx installs the same wheel."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet.lab.cluster import Lab
from tests.conftest import ROOT
from tests.lab.conftest import node_sh

WHEELHOUSE = ROOT / ".wheelhouse"
OFFLINE = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(WHEELHOUSE),
           "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def _run(argv: list[str], cwd: Path, timeout: float = 600,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items()
                   if not k.startswith(("GPUFLEET_", "VIRTUAL_ENV", "PYTHONPATH"))}
    environment.update(OFFLINE)
    environment.update(env or {})
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=environment, check=False)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not WHEELHOUSE.is_dir():
        pytest.fail(f"{WHEELHOUSE} is missing: scripts/setup keeps the dependencies' wheels "
                    "there")
    out = tmp_path_factory.mktemp("dist")
    built = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                  "-w", str(out), str(ROOT)], cwd=out)
    assert built.returncode == 0, built.stdout + built.stderr
    [found] = out.glob("gpufleet-*.whl")
    return found


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh venv with only the wheel and its dependencies in it."""
    venv = tmp_path_factory.mktemp("controller") / "venv"
    made = _run([sys.executable, "-m", "venv", str(venv)], cwd=venv.parent)
    assert made.returncode == 0, made.stderr
    pip = _run([str(venv / "bin" / "pip"), "install", "-q", str(wheel)], cwd=venv.parent)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    yield venv
    shutil.rmtree(venv, ignore_errors=True)


def test_site_packages_holds_only_the_gpufleet_package(installed: Path) -> None:
    [site] = installed.glob("lib/python*/site-packages")
    assert (site / "gpufleet" / "templates" / "cuda.list.j2").is_file()
    assert (site / "gpufleet" / "suites" / "test_gpu.py").is_file()
    assert (site / "gpufleet" / "suites" / "probes" / "allreduce.py").is_file()
    assert (site / "gpufleet" / "node" / "healthcheck.py").is_file()
    assert (site / "gpufleet" / "roles" / "driver.py").is_file()
    assert (site / "gpufleet" / "dashboards" / "grafana.json").is_file()
    templates = site / "gpufleet" / "report" / "templates"
    assert {p.name for p in templates.iterdir()} >= {
        "base.html.j2", "macros.html.j2", "conformance.html.j2", "drift.html.j2",
        "acceptance.html.j2", "filter.js"}
    assert sorted(p.name for p in (site / "gpufleet" / "schemas").iterdir()) == [
        f"{name}.schema.json" for name in ("baseline", "bootstrap", "common", "conformance",
                                           "drift", "facts", "node", "provision")]
    for name in ("roles", "conformance", "templates", "tasks.py", "tests", "inventory"):
        assert not (site / name).exists(), name
    [record] = site.glob("gpufleet-*.dist-info/top_level.txt")
    assert record.read_text().split() == ["gpufleet"]


def test_the_installed_package_renders_the_html_reports(installed: Path, tmp_path: Path
                                                        ) -> None:
    """Its templates and ClusterShell (from the wheelhouse) are there: a report renders."""
    script = ("import json, sys; from gpufleet.report import html; "
              "from gpufleet.report.html.page import fold; "
              "doc = json.load(open(sys.argv[1])); "
              "print(len(html.render_conformance(doc)), fold(['n1', 'n2', 'n3']))")
    done = _run([str(installed / "bin" / "python"), "-c", script,
                 str(ROOT / "tests" / "fixtures" / "h200x2" / "gpufleet" / "conformance.json")],
                cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    size, folded = done.stdout.split()
    assert int(size) > 10_000 and folded == "n[1-3]"


def test_the_installed_command_provisions_and_checks_the_lab(
        installed: Path, provisioned: Path, lab: Lab, tmp_path: Path) -> None:
    command = str(installed / "bin" / "gpufleet")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    helped = _run([command, "--help"], cwd=elsewhere)
    assert helped.returncode == 0, helped.stderr
    listed = _run([command, "inventory", "--list", "-i", str(provisioned)], cwd=elsewhere)
    assert listed.returncode == 0, listed.stderr
    assert "node01" in json.loads(listed.stdout)["_meta"]["hostvars"]
    # a file the wheel's templates render has drifted on node01: provision puts it back
    node_sh(lab, "node01", "echo 'NCCL_DEBUG=TRACE' >> /etc/nccl.conf")
    fixed = _run([command, "provision", "-i", str(provisioned), "-l", "node01", "--reboot"],
                 cwd=elsewhere)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "nccl_env" in fixed.stdout
    drift = _run([command, "drift", "-i", str(provisioned), "-l", "node01:node02",
                  "--report-dir", str(tmp_path / "history"), "--json", "-"], cwd=elsewhere)
    assert drift.returncode == 0, drift.stdout + drift.stderr
    assert json.loads(drift.stdout)["summary"]["items"] == 0
    assert not (elsewhere / "reports").exists()  # the history went where it was told


def test_the_installed_schemas_load_and_validate_what_the_command_writes(
        installed: Path, tmp_path: Path) -> None:
    (tmp_path / "hosts.yml").write_text("all:\n  hosts:\n    here:\n"
                                        "      ansible_connection: local\n")
    facts = _run([str(installed / "bin" / "gpufleet"), "facts", "-i", "hosts.yml", "--json",
                  "facts.json"], cwd=tmp_path)
    assert facts.returncode == 0, facts.stdout + facts.stderr
    check = ("import json\n"
             "from importlib.resources import files\n"
             "from gpufleet.report import schemas\n"
             "shipped = files('gpufleet').joinpath('schemas')\n"
             "for schema_id in schemas.ids():\n"
             "    assert schemas.load(schema_id)['$id'].endswith(schema_id)\n"
             "schemas.validate(json.load(open('facts.json')))\n"
             "print(sorted(p.name for p in shipped.iterdir()))\n")
    done = _run([str(installed / "bin" / "python"), "-c", check], cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "drift.schema.json" in done.stdout


def test_pipx_installs_a_working_command(wheel: Path, tmp_path: Path) -> None:
    home, bin_dir = tmp_path / "pipx", tmp_path / "bin"
    env = {"PIPX_HOME": str(home), "PIPX_BIN_DIR": str(bin_dir),
           "PIPX_MAN_DIR": str(tmp_path / "man"), "PIPX_DEFAULT_PYTHON": sys.executable}
    pipx = str(Path(sys.executable).with_name("pipx"))
    done = _run([pipx, "install", str(wheel)], cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    version = _run([str(bin_dir / "gpufleet"), "--version"], cwd=tmp_path)
    assert version.returncode == 0, version.stderr
    assert version.stdout.startswith("gpufleet ")
