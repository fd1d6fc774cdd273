"""NVIDIA Xid errors: which ones fail a node. The one table the gpu suite, the Slurm health
check role and its node program (through the configuration the role writes) all use."""

from __future__ import annotations

# Hardware, memory and GPU firmware failures (NVIDIA's Xid catalogue): the node is unfit.
CRITICAL_XIDS = (48, 56, 57, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140)

# What each Xid means for a node (NVIDIA's Xid catalogue): hardware, memory and GPU
# firmware failures fail it; errors an application usually causes (a fault in its own
# kernel) are reported; stop/cleanup notices are ignored. Xids not listed are reported.
XID_POLICY: dict[int, str] = {
    **dict.fromkeys(CRITICAL_XIDS, "fail"),
    **dict.fromkeys((13, 31, 32, 38, 61, 69), "warn"),
    **dict.fromkeys((43, 45, 68), "ignore"),
}
XID_ACTIONS = ("fail", "warn", "ignore")
