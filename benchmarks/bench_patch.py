"""Time `llamacpp-mla-port patch` with a warm download cache (not a test: prints numbers).

Measures, side by side: a rerun on an existing work tree (the everyday case after editing a
template), and a run into a fresh work dir (clone from the cache + checkout + apply).
Target: the everyday case well under 5 s on the 2-core reference machine.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TOOL = [sys.executable, "-m", "llamacpp_mla_port", "patch"]


def timed(args: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(TOOL + args, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        patches = ["--patches-dir", str(Path(tmp) / "patches")]
        fresh = [timed(["--work-dir", str(Path(tmp) / f"w{i}")] + patches) for i in range(2)]
        warm = [timed(["--work-dir", str(Path(tmp) / "w0")] + patches) for _ in range(5)]
    print(f"fresh work dir : median {statistics.median(fresh):6.2f} s  ({len(fresh)} runs)")
    print(f"rerun (warm)   : median {statistics.median(warm):6.2f} s  ({len(warm)} runs)")
    print(f"ratio fresh/rerun: {statistics.median(fresh) / statistics.median(warm):.1f}x")


if __name__ == "__main__":
    main()
