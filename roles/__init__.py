"""The roles gpufleet applies, in order: the stack first, the firewall last."""

from __future__ import annotations

from gpufleet.errors import GpufleetError
from gpufleet.role import Role
from roles import cuda, driver, firewall, nccl, nccl_env, pytorch

ALL: list[Role] = [driver.ROLE, cuda.ROLE, nccl.ROLE, pytorch.ROLE, nccl_env.ROLE, firewall.ROLE]


def select(names: str | None) -> list[Role]:
    """Roles named in a comma-separated list (all when None), in application order."""
    if not names:
        return list(ALL)
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    known = {r.name for r in ALL}
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise GpufleetError(f"unknown role(s) {', '.join(unknown)}; roles are "
                            f"{', '.join(r.name for r in ALL)}")
    return [r for r in ALL if r.name in wanted]
