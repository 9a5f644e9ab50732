"""What a benchmark ran on, recorded in its JSON: the shared 2-core development machine is
loaded by other work, so every result says how loaded (the 1, 5 and 15 min load averages
at the end of the run) next to its figures, and which CPU: machines of one kind differ in
it (an AMD EPYC one day, an Intel Xeon the next), so figures of two runs compare only
through a baseline measured in the same run."""

from __future__ import annotations

import os
import platform
import sys
from typing import Any


def cpu_model() -> str:
    """The CPU's model name as Linux reports it ("" where it does not)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return ""


def machine() -> dict[str, Any]:
    """Platform, CPU model and count, Python, and the load averages now."""
    return {
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }
