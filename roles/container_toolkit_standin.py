"""The lab's stand-ins of NVIDIA Container Toolkit packages: the real names, versions and
dependencies (NVIDIA's debian/control of nvidia-container-toolkit and libnvidia-container),
and an ``nvidia-ctk`` that writes what the real one writes: the ``nvidia`` runtime into
Docker's daemon.json or containerd's config.toml (``runtime configure``), and a CDI spec of
the node's GPUs and loaded driver (``cdi generate``, read from ``nvidia-smi -L`` and
/proc/driver/nvidia/version), in the shape of a spec generated on a real node."""

from __future__ import annotations

from collections.abc import Iterable

from gpufleet.provision.standins import Standin

NVIDIA_CTK = r'''#!/usr/bin/python3
"""gpufleet lab stand-in for nvidia-ctk (NVIDIA Container Toolkit CLI)."""
import json, os, re, subprocess, sys, tomllib

VERSION = "@VERSION@"


def log(level, message):
    print(f"{level}[0000] {message}", file=sys.stderr)


def options(args):
    found = {}
    for arg in args:
        key, _, value = arg.lstrip("-").partition("=")
        found[key] = value if _ else True
    return found


def toml_value(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(str(value))


def toml_table(data, path, out):
    scalars = {k: v for k, v in data.items() if not isinstance(v, dict)}
    tables = {k: v for k, v in data.items() if isinstance(v, dict)}
    if path and scalars:
        out.append("")
        out.append("[" + ".".join(json.dumps(p) if "." in p else p for p in path) + "]")
    for key, value in scalars.items():
        out.append(f"{key} = {toml_value(value)}")
    for key, value in tables.items():
        toml_table(value, [*path, key], out)


def configure(opts):
    runtime = opts.get("runtime", "docker")
    default = opts.get("set-as-default") is True
    if runtime == "docker":
        path = opts.get("config") or "/etc/docker/daemon.json"
        data = {}
        if os.path.exists(path) and open(path).read().strip():
            data = json.load(open(path))
        data.setdefault("runtimes", {})["nvidia"] = {"args": [],
                                                    "path": "nvidia-container-runtime"}
        if default:
            data["default-runtime"] = "nvidia"
        text = json.dumps(data, indent=4) + "\n"
    elif runtime == "containerd":
        path = opts.get("config") or "/etc/containerd/config.toml"
        data = tomllib.load(open(path, "rb")) if os.path.exists(path) else {}
        data.setdefault("version", 2)
        cri = data.setdefault("plugins", {}).setdefault("io.containerd.grpc.v1.cri", {})
        section = cri.setdefault("containerd", {})
        section.setdefault("runtimes", {})["nvidia"] = {
            "privileged_without_host_devices": False, "runtime_engine": "",
            "runtime_root": "", "runtime_type": "io.containerd.runc.v2",
            "options": {"BinaryName": "/usr/bin/nvidia-container-runtime"}}
        if default:
            section["default_runtime_name"] = "nvidia"
        out = []
        toml_table(data, [], out)
        text = "\n".join(out).lstrip("\n") + "\n"
    else:
        log("ERRO", f"unrecognized runtime '{runtime}'")
        return 1
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        fh.write(text)
    log("INFO", f"Wrote updated config to {path}")
    log("INFO", f"It is recommended that {runtime} daemon be restarted.")
    return 0


def driver():
    try:
        line = open("/proc/driver/nvidia/version").readline()
    except OSError:
        return None
    match = re.search(r"  (\d+\.\d+(?:\.\d+)?)  ", line)
    return match.group(1) if match else None


def gpus():
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
    return re.findall(r"^GPU (\d+): .* \(UUID: (GPU-[0-9a-fA-F-]+)\)", out, re.MULTILINE)


def yaml_lines(value, indent=0):
    pad = " " * indent
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, (dict, list)):
                yield f"{pad}{key}:"
                yield from yaml_lines(item, indent + 2)
            else:
                yield f"{pad}{key}: {json.dumps(item) if item.isdigit() else item}"
    else:
        for item in value:
            if isinstance(item, dict):
                first, *rest = list(yaml_lines(item, indent + 2))
                yield f"{pad}- {first.lstrip()}"
                yield from rest
            else:
                yield f"{pad}- {item}"


def spec(version, found):
    libdir = "/usr/lib/x86_64-linux-gnu"
    def node(i):
        return {"deviceNodes": [{"path": f"/dev/nvidia{i}"}]}
    devices = [{"containerEdits": node(i), "name": i} for i, _ in found]
    devices += [{"containerEdits": node(i), "name": uuid} for i, uuid in found]
    devices.append({"containerEdits": {"deviceNodes": [{"path": f"/dev/nvidia{i}"}
                                                       for i, _ in found]}, "name": "all"})
    hook = "/usr/bin/nvidia-cdi-hook"
    mounts = [f"{libdir}/libcuda.so.{version}", f"{libdir}/libnvidia-ml.so.{version}",
              "/usr/bin/nvidia-smi"]
    return {
        "cdiVersion": "0.5.0",
        "containerEdits": {
            "deviceNodes": [{"path": "/dev/nvidia-uvm"}, {"path": "/dev/nvidiactl"}],
            "env": ["NVIDIA_VISIBLE_DEVICES=void"],
            "hooks": [
                {"args": ["nvidia-cdi-hook", "create-symlinks", "--link",
                          f"libcuda.so.1::{libdir}/libcuda.so"],
                 "hookName": "createContainer", "path": hook},
                {"args": ["nvidia-cdi-hook", "enable-cuda-compat",
                          f"--host-driver-version={version}"],
                 "hookName": "createContainer", "path": hook},
                {"args": ["nvidia-cdi-hook", "update-ldcache", "--folder", libdir],
                 "hookName": "createContainer", "path": hook}],
            "mounts": [{"containerPath": m, "hostPath": m,
                        "options": ["ro", "nosuid", "nodev", "bind"]} for m in mounts]},
        "devices": devices,
        "kind": "nvidia.com/gpu",
    }


def generate(opts):
    version = driver()
    if version is None:
        log("ERRO", "failed to generate CDI spec: failed to create device CDI specs: failed "
            "to initialize NVML: ERROR_LIBRARY_NOT_FOUND")
        return 1
    log("INFO", f"Using driver version {version}")
    text = "---\n" + "\n".join(yaml_lines(spec(version, gpus()))) + "\n"
    path = opts.get("output")
    if not path:
        sys.stdout.write(text)
        return 0
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as fh:
        fh.write(text)
    os.replace(path + ".tmp", path)
    log("INFO", "Generated CDI spec with version 0.5.0")
    return 0


def main(argv):
    if argv[:1] in (["--version"], ["-v"]):
        print(f"NVIDIA Container Toolkit CLI version {VERSION}\ncommit: gpufleet-lab")
        return 0
    if argv[:2] == ["runtime", "configure"]:
        return configure(options(argv[2:]))
    if argv[:2] == ["cdi", "generate"]:
        return generate(options(argv[2:]))
    if argv[:2] == ["cdi", "list"]:
        version, found = driver(), gpus()
        names = [i for i, _ in found] + [u for _, u in found] + ["all"] if version else []
        log("INFO", f"Found {len(names)} CDI devices")
        print("\n".join(f"nvidia.com/gpu={n}" for n in names))
        return 0
    print(f"lab nvidia-ctk: command not provided by the stand-in: {' '.join(argv)}",
          file=sys.stderr)
    return 2


sys.exit(main(sys.argv[1:]))
'''


def toolkit_standins(versions: Iterable[str]) -> list[Standin]:
    """The four toolkit packages at each version, depending on each other exactly as
    NVIDIA's packages do."""
    found: list[Standin] = []
    for version in versions:
        upstream = version.split("-")[0]
        found += [
            Standin("libnvidia-container1", version, "NVIDIA container runtime library"),
            Standin("libnvidia-container-tools", version,
                    "NVIDIA container runtime library (command-line tools)",
                    files={"/usr/bin/nvidia-container-cli": "#!/bin/sh\necho "
                           f"'cli-version: {upstream}'\n"},
                    executables=frozenset({"/usr/bin/nvidia-container-cli"}),
                    depends=f"libnvidia-container1 (>= {version})"),
            Standin("nvidia-container-toolkit-base", version, "NVIDIA Container Toolkit Base",
                    files={"/usr/bin/nvidia-ctk": NVIDIA_CTK.replace("@VERSION@", upstream),
                           "/usr/bin/nvidia-container-runtime":
                               "#!/bin/sh\nexec runc \"$@\"\n"},
                    executables=frozenset({"/usr/bin/nvidia-ctk",
                                           "/usr/bin/nvidia-container-runtime"})),
            Standin("nvidia-container-toolkit", version, "NVIDIA Container toolkit",
                    depends=f"nvidia-container-toolkit-base (= {version}), "
                            f"libnvidia-container-tools (= {version}), "
                            "libnvidia-container-tools (<< 2.0.0)"),
        ]
    return found
