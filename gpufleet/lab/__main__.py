"""``python -m gpufleet.lab``: lab operations that run outside invoke (a node's reboot)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpufleet.errors import GpufleetError
from gpufleet.lab.cluster import Lab
from gpufleet.lab.model import LabConfig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpufleet.lab")
    parser.add_argument("--name", default=LabConfig.name)
    parser.add_argument("--root", type=Path, default=LabConfig.root)
    parser.add_argument("--subnet", default=LabConfig.subnet)
    parser.add_argument("--inventory-dir", type=Path, default=LabConfig.inventory_dir)
    sub = parser.add_subparsers(dest="command", required=True)
    reboot = sub.add_parser("reboot-node", help="stop a node's processes and boot it again")
    reboot.add_argument("node")
    reboot.add_argument("--delay", type=float, default=0.0)
    args = parser.parse_args(argv)
    lab = Lab(LabConfig(args.name, args.root, args.subnet, args.inventory_dir))
    try:
        lab.reboot(args.node, delay=args.delay)
    except GpufleetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
