"""The run directory's records are written whole: another shell's `status` or `down`
reads them the moment they appear (a half-written job id once read as "")."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from dynamoctl.supervisor.rundir import JOB_FILE, RunDir


def test_the_submitted_job_is_recorded_by_rename_and_private(tmp_path: Path) -> None:
    run = RunDir("queued", tmp_path)
    umask = os.umask(0o022)
    try:
        run.create()  # sets this process's umask to 077, as `up` does
    finally:
        os.umask(umask)
    run.write_slurm_job("41")
    with (run.path / JOB_FILE).open() as earlier:
        run.write_slurm_job("42")
        # A reader holding the first file still sees it whole: the second is a new file
        # renamed over it, never the first truncated and rewritten.
        assert earlier.read() == "41\n"
    assert run.slurm_job(None) == "42"
    assert stat.S_IMODE((run.path / JOB_FILE).stat().st_mode) == 0o600
    assert sorted(p.name for p in run.path.iterdir() if p.name.endswith(".tmp")) == []
