"""What a benchmark ran on, recorded in its JSON: the shared 2-core development machine is
loaded by other work, so every result says how loaded (the 1, 5 and 15 min load averages
at the end of the run) next to its figures."""

from __future__ import annotations

import os
import platform
import sys
from typing import Any


def machine() -> dict[str, Any]:
    """Platform, Python, CPU count and the load averages now."""
    return {
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }
