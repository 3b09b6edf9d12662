"""Run one stage of `make test` and append its wall time to a log: the breakdown `make slowest` prints.

    python .ci/stage.py --log .cache/timings/stages.tsv NAME -- COMMAND [ARG ...]

Runs COMMAND, then appends ``NAME<TAB>seconds<TAB>exit status`` to the log and prints
``stage NAME: N s``. Exits with COMMAND's status, so a failing stage still stops make.
Standard library only: it also times the stage that creates the venv.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--log", type=Path, required=True, help="the TSV file the stage's time is appended to")
    parser.add_argument("name", help="the stage's name in the breakdown")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --")
    if "\t" in args.name or "\n" in args.name:
        parser.error("the stage name may not hold a tab or a newline")
    start = time.monotonic()
    status = subprocess.call(command)
    seconds = time.monotonic() - start
    args.log.parent.mkdir(parents=True, exist_ok=True)
    with args.log.open("a") as log:
        log.write(f"{args.name}\t{seconds:.1f}\t{status}\n")
    print(f"stage {args.name}: {seconds:.0f} s" + ("" if status == 0 else f" (failed, exit status {status})"),
          flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
