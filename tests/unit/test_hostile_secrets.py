"""Secrets stay out of diffs, reports and process lists; cron and systemd keep every '%'."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from gpufleet.drift import schedule
from gpufleet.errors import GpufleetError
from gpufleet.inventory import listing
from gpufleet.inventory.load import load_inventory
from gpufleet.inventory.secrets import is_secret_name, redact
from gpufleet.provision.managed import unified_diff
from gpufleet.provision.role import RoleVars
from gpufleet.roles import pytorch


@pytest.mark.parametrize(("line", "shown"), [
    ("DB_PASS=hunter2", "DB_PASS=********"),
    ("ansible_ssh_pass: hunter2", "ansible_ssh_pass: ********"),
    ("PASSPHRASE = open sesame", "PASSPHRASE = ********"),
    ("GITHUB_PAT=ghp_abcdef", "GITHUB_PAT=********"),
    ("PRIVATE_KEY: abc", "PRIVATE_KEY: ********"),
    ("AWS_SECRET_ACCESS_KEY=abc", "AWS_SECRET_ACCESS_KEY=********"),
    ('"api_token": "x y"', '"api_token": ********'),
    ("index-url = https://user:tok3n@pypi.example/simple",
     "index-url = https://user:********@pypi.example/simple"),
    ("remote https://ghp_token@github.com/org/repo", "remote https://********@github.com/org/repo"),
    ("machine pypi.example login user password p4ss",
     "machine pypi.example login user password ********"),
    ("tool --password hunter3 -v", "tool --password ******** -v"),
    ("tool --token=tok -v", "tool --token=******** -v"),
    ("Authorization: Bearer eyJhbGci", "Authorization: Bearer ********"),
    ("ExecStart=/usr/bin/x --token-file /etc/x", "ExecStart=/usr/bin/x --token-file /etc/x"),
    ("path=/opt/pat/pass bypass_cache=1", "path=/opt/pat/pass bypass_cache=1"),
    ("NCCL_DEBUG=WARN", "NCCL_DEBUG=WARN"),
])
def test_redaction(line: str, shown: str) -> None:
    assert redact(line) == shown


def test_a_private_key_block_keeps_only_its_frame() -> None:
    text = ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXk\nAAAA\n"
            "-----END OPENSSH PRIVATE KEY-----\n")
    assert redact(text) == ("-----BEGIN OPENSSH PRIVATE KEY-----\n********\n"
                            "-----END OPENSSH PRIVATE KEY-----\n")


def test_an_inventory_secret_is_redacted_wherever_it_appears(tmp_path: Path) -> None:
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  hosts:\n    gpu01:\n      ansible_become_password: "
                         "'Tr0ub4dor&3'\n      ansible_ssh_private_key_file: /keys/gpu01\n")
    load_inventory(inventory)
    diff = unified_diff("/etc/default/gpufleet-nccl", "NCCL_DEBUG=WARN\n",
                        "Tr0ub4dor&3\nNCCL_DEBUG=WARN\n")
    assert "Tr0ub4dor&3" not in diff
    assert "+********\n" in diff
    assert "/keys/gpu01" in redact("key at /keys/gpu01")


@pytest.mark.parametrize(("name", "secret"), [
    ("ansible_become_password", True), ("ansible_ssh_pass", True), ("db_pass", True),
    ("GITHUB_PAT", True), ("gpg_passphrase", True), ("vault_token", True),
    ("ansible_ssh_private_key_file", False), ("pytorch_index_url", False),
    ("bypass", False), ("path", False), ("ansible_user", False)])
def test_secret_names(name: str, secret: bool) -> None:
    assert is_secret_name(name) is secret


# Names credentials go by in real deployments: Hugging Face (HF_TOKEN, HF_AUTH as training
# launchers pass it, HUGGING_FACE_HUB_TOKEN), Weights & Biases, AWS, NVIDIA NGC, GitHub,
# Docker registries, Slurm's JWT and munge, Ansible's connection variables and the vault_
# convention of its documentation ("Keep vaulted variables safely visible").
REAL_SECRET_NAMES = [
    "HF_TOKEN", "HF_AUTH", "HUGGING_FACE_HUB_TOKEN", "WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN", "NGC_API_KEY", "NGC_CLI_API_KEY", "GITHUB_PAT", "GH_TOKEN",
    "MYSQL_ROOT_PASSWD", "db_passwd", "DB_PWD", "ansible_ssh_pass", "ansible_become_pass",
    "ansible_password", "ansible_become_password", "bmc_password", "AZURE_CREDENTIALS",
    "registry_credentials", "DOCKER_AUTH_CONFIG", "registry_auth", "SLURM_JWT", "MUNGE_KEY",
    "vault_hf", "SECRET_KEY", "session_cookie",
]
REAL_PLAIN_NAMES = [
    "nvidia_repo_keyring", "nvidia_repo_keyring_path", "ansible_ssh_private_key_file",
    "vault_password_file", "gpufleet_known_hosts", "author", "NCCL_IB_HCA", "keyboard",
    "passive", "compass", "ansible_user", "pytorch_index_url", "monkey",
]


@pytest.mark.parametrize("name", REAL_SECRET_NAMES)
def test_real_credential_names_are_secret(name: str) -> None:
    assert is_secret_name(name)
    assert redact(f"{name}=hf_abcdEFGH1234") == f"{name}=********"


@pytest.mark.parametrize("name", REAL_PLAIN_NAMES)
def test_names_of_places_and_plain_words_are_not(name: str) -> None:
    assert not is_secret_name(name)


def test_every_value_the_inventory_keeps_as_a_secret_is_redacted(tmp_path: Path) -> None:
    """HF_AUTH's value, a vault_ variable's and the one that refers to it, and a secret
    inside an environment mapping are masked in --host and wherever they appear."""
    (tmp_path / "hosts.yml").write_text(
        "all:\n  vars:\n    vault_hf: hf_VaultedValue1\n    hf: '{{ vault_hf }}'\n"
        "    pytorch_env: {HF_AUTH: hf_InsideAMapping2, NCCL_DEBUG: WARN}\n"
        "  hosts:\n    gpu01:\n      HF_AUTH: hf_TopLevelValue3\n")
    host = load_inventory(tmp_path / "hosts.yml").hosts["gpu01"]
    shown = json.dumps(listing.host_vars(host))
    for value in ("hf_VaultedValue1", "hf_InsideAMapping2", "hf_TopLevelValue3"):
        assert value not in shown
        assert redact(f"pip said: {value} rejected") == "pip said: ******** rejected"
    assert '"NCCL_DEBUG": "WARN"' in shown


def pip_step(tmp_path: Path, extra: str) -> pytorch.PipInstall:
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  hosts:\n    gpu01:\n      pytorch_version: '2.13.0'\n"
                         + "".join(f"      {line}\n" for line in extra.splitlines()))
    v = RoleVars(load_inventory(inventory).hosts["gpu01"], pytorch.ROLE.defaults)
    args = pytorch.ROLE._pip_args(v, "2.13.0", False)
    return pytorch.PipInstall("/opt/venv/bin/python", args, "2.13.0", None, None, 60.0)


def test_a_token_in_the_index_url_never_reaches_the_command_line(tmp_path: Path) -> None:
    step = pip_step(tmp_path, "pytorch_index_url: https://ci:s3cr3t-tok@pypi.example/simple\n"
                    "pytorch_extra_index_url: https://mirror.example/simple?token=abc\n"
                    "pytorch_find_links: /srv/wheels dir")
    command, stdin = step.command()
    assert "s3cr3t-tok" not in command and "token=abc" not in command
    assert "s3cr3t-tok" not in repr(step)
    assert stdin == (b"https://ci:s3cr3t-tok@pypi.example/simple\n"
                     b"https://mirror.example/simple?token=abc\n")
    assert command.startswith("IFS= read -r PIP_INDEX_URL && export PIP_INDEX_URL && "
                              "IFS= read -r PIP_EXTRA_INDEX_URL && export PIP_EXTRA_INDEX_URL "
                              "&& exec ")
    assert shlex.split(command.split("exec ", 1)[1])[-3:] == [
        "--find-links", "/srv/wheels dir", "torch==2.13.0"]


def test_a_line_break_in_a_package_source_is_refused(tmp_path: Path) -> None:
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  hosts:\n    gpu01:\n      pytorch_version: '2.13.0'\n"
                         '      pytorch_index_url: "https://pypi.example/simple\\nevil"\n')
    v = RoleVars(load_inventory(inventory).hosts["gpu01"], pytorch.ROLE.defaults)
    with pytest.raises(GpufleetError) as caught:
        pytorch.ROLE.check(v)
    assert str(caught.value).startswith(
        "host gpu01: variable pytorch_index_url must be one URL or path: on one line, not "
        "starting with - or a space, got 'https://pypi.example/simple\\nevil' (")


def cron_command(line: str) -> tuple[str, str]:
    """The command cron runs for a crontab line, and its stdin: cron ends the command at
    the first unescaped % and turns '\\%' into '%' (cronie, Vixie cron)."""
    command = line.split(" ", 6)[6]
    out: list[str] = []
    escaped = False
    for index, char in enumerate(command):
        if escaped:
            out.append(char if char == "%" else "\\" + char)
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == "%":
            return "".join(out), command[index + 1:]
        else:
            out.append(char)
    return "".join(out), ""


def test_percent_signs_survive_cron_and_systemd() -> None:
    args = ["--limit", "gpu%01", "--json", "/srv/reports/drift-$(date +%F).json"]
    plan = schedule.Schedule(Path("/srv/pro%ject"), args, "04:00",
                             ("/srv/pro%ject/venv/bin/python", "-m", "gpufleet"))
    command, stdin = cron_command(plan.cron_line())
    assert stdin == ""
    assert shlex.split(command) == [
        "cd", "/srv/pro%ject", "&&", "/srv/pro%ject/venv/bin/python", "-m", "gpufleet",
        "drift", *args, ">>", "/srv/pro%ject/reports/drift/cron.log", "2>&1"]
    service = plan.units()["gpufleet-drift.service"]
    assert "WorkingDirectory=/srv/pro%%ject\n" in service
    assert ("ExecStart=/srv/pro%%ject/venv/bin/python -m gpufleet drift --limit gpu%%01 "
            "--json '/srv/reports/drift-$$(date +%%F).json'\n") in service
