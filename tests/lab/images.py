"""Training images and Podman on lab nodes, from nothing but Debian's packages and the lab's
wheelhouse (nothing is pulled from a registry).

The image's root filesystem is a minimal Debian made by debootstrap, with python3 and the
lab's CPU torch installed into it (cached across runs under /var/cache/gpufleet-lab). It is
imported once into an image store of the lab's own; every node's Podman reads it from there
(an additional image store) and builds its own images on top of it: only the declarations
NVIDIA's images carry (CUDA_VERSION, NVIDIA_REQUIRE_CUDA, NCCL_VERSION, labels) and the
entrypoint differ, so a node can hold its own variant of a tag.

A lab node runs containers once it has cgroups (its sysfs is its own: the controller's
hierarchies are mounted again inside it), a storage.conf on the controller's filesystem
(overlay cannot stack on the node's overlaid /var) and rlimits it may set (the lab has no
CAP_SYS_RESOURCE, so a container may not raise a limit above the node's own).
"""

from __future__ import annotations

import json
import resource
import shlex
import shutil
import subprocess
import zipfile
from pathlib import Path

from gpufleet.lab.cluster import Lab
from tests.lab.conftest import node_sh

CACHE = Path("/var/cache/gpufleet-lab")
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
TORCH = "torch-2.13.0"
# torch and what it imports, from the lab's wheelhouse
WHEELS = frozenset({"torch", "filelock", "fsspec", "jinja2", "markupsafe", "mpmath",
                    "networkx", "sympy", "typing_extensions"})
BASE = "localhost/gpufleet-lab/base:1"
# conmon runs a container's processes under at most this many processes
NPROC_CEILING = 32768


UNUSED = ("torch/include/", "torch/test/")


def rootfs(wheelhouse: Path) -> Path:
    """Debian with python3 and the lab's torch (built once, then reused)."""
    done = CACHE / f"image-rootfs-{SUITE}-{TORCH}-1"
    if (done / "etc" / "gpufleet-lab-image").exists():
        return done
    building = done.with_name(done.name + ".building")
    shutil.rmtree(building, ignore_errors=True)
    building.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["debootstrap", "--variant=minbase", "--include=python3", SUITE,
                    str(building), MIRROR], check=True, capture_output=True, timeout=900)
    # the wheels unpacked where Debian's python3 finds them (a wheel is a zip of its files;
    # torch runs as python3 -m torch.distributed.run, no entry point is needed)
    site = building / "usr/local/lib/python3.11/dist-packages"
    site.mkdir(parents=True, exist_ok=True)
    for wheel in sorted(wheelhouse.glob("*.whl")):
        if wheel.name.split("-")[0].lower() in WHEELS:
            _unpack(wheel, site)
    (building / "etc" / "gpufleet-lab-image").write_text("gpufleet lab training image\n")
    shutil.rmtree(done, ignore_errors=True)
    building.rename(done)
    return done


def _unpack(wheel: Path, site: Path) -> None:
    """A wheel's files into ``site``, with their modes (torch's C++ headers and its own
    tests left out: nothing imports them)."""
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.infolist():
            if member.filename.startswith(UNUSED):
                continue
            path = Path(archive.extract(member, site))
            mode = member.external_attr >> 16 & 0o777
            if mode and not member.is_dir():
                path.chmod(mode)


def store(lab: Lab) -> Path:
    """The lab's image store, holding the base image."""
    path = lab.config.root / "images"
    podman = ["podman", "--root", str(path), "--runroot",
              f"/run/gpufleet-lab-{lab.config.name}-images", "--storage-driver", "overlay"]
    listed = subprocess.run([*podman, "images", "--format", "json"], capture_output=True,
                            text=True, check=True)
    if any(BASE in (i.get("Names") or []) for i in json.loads(listed.stdout or "[]")):
        return path
    root = rootfs(lab.config.wheelhouse)
    tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
    subprocess.run([*podman, "import", "--change", 'CMD ["python3"]', "-", BASE],
                   stdin=tar.stdout, check=True, capture_output=True, timeout=600)
    tar.wait(timeout=60)
    return path


def _cgroup_mounts() -> list[str]:
    """The commands that mount the controller's cgroup hierarchies again (v1's, or the
    cgroup2 hierarchy of a host that has only that)."""
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    commands = []
    for line in lines:
        left, _, right = line.partition(" - ")
        target, fstype = left.split()[4], right.split()[0]
        if not target.startswith("/sys/fs/cgroup") or (
                fstype == "cgroup2" and target != "/sys/fs/cgroup"):
            continue  # a hybrid host's cgroup2 beside v1's: crun takes v1 alone
        options = right.split()[2]
        commands.append(f"mkdir -p {target} && mount -t {fstype} -o {options} {fstype} "
                        f"{target}")
    return commands


def enable(lab: Lab, node: str, images: Path) -> None:
    """Podman on ``node``: cgroups, its own storage over the lab's image store, rlimits."""
    graph = lab.config.root / "containers" / node
    graph.mkdir(parents=True, exist_ok=True)
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = min(resource.getrlimit(resource.RLIMIT_NPROC)[1], NPROC_CEILING)
    storage = (f'[storage]\ndriver = "overlay"\ngraphroot = "{graph}"\n'
               'runroot = "/run/containers/storage"\n'
               f'[storage.options]\nadditionalimagestores = ["{images}"]\n')
    containers = ('[containers]\ndefault_ulimits = '
                  f'["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]\n')
    node_sh(lab, node, "\n".join([
        "if [ \"$(stat -f -c %T /sys/fs/cgroup)\" = sysfs ]; then", *_cgroup_mounts(), "fi",
        "mkdir -p /etc/containers",
        f"printf '%s' {shlex.quote(storage)} > /etc/containers/storage.conf",
        f"printf '%s' {shlex.quote(containers)} > /etc/containers/containers.conf",
    ]))


def build(lab: Lab, node: str, tag: str, env: dict[str, str], *,
          labels: dict[str, str] | None = None, entrypoint: list[str] | None = None) -> str:
    """An image on ``node`` over the base: its declarations and entrypoint; its ID (the same
    on every node that builds the same image: the build's timestamp is fixed)."""
    lines = [f"FROM {BASE}"]
    lines += [f"ENV {k}={json.dumps(v)}" for k, v in env.items()]
    lines += [f"LABEL {k}={json.dumps(v)}" for k, v in (labels or {}).items()]
    if entrypoint is not None:
        lines.append(f"ENTRYPOINT {json.dumps(entrypoint)}")
    context = f"/tmp/gpufleet-image-{tag.rsplit(':', 1)[-1]}"
    node_sh(lab, node, f"mkdir -p {context} && printf '%s\\n' "
            f"{shlex.quote(chr(10).join(lines))} > {context}/Containerfile")
    return node_sh(lab, node, f"podman build -q --no-cache --timestamp=0 -t {shlex.quote(tag)} "
                   f"{context}").strip()
