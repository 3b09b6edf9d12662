"""Run one stage of `make test` and append its wall time to a log: the breakdown `make slowest` prints.

    python .ci/stage.py --log .cache/timings/stages.tsv [--output FILE] NAME -- COMMAND [ARG ...]

Runs COMMAND, then appends ``NAME<TAB>seconds<TAB>exit status<TAB>start<TAB>end`` to the log (start
and end in seconds since the epoch, so that stages run side by side can be told apart and the
run's wall time computed) and prints ``stage NAME: N s``. Exits with COMMAND's status, so a
failing stage still stops make.

``--output FILE``: for a stage that runs beside another (the unit tests beside the notebooks):
COMMAND's output goes to FILE and is printed in one piece when it ends, instead of interleaving
with the other stage's lines. Standard library only: it also times the stage that creates the venv.
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
    parser.add_argument("--output", type=Path, default=None,
                        help="write the command's output here and print it when the command ends")
    parser.add_argument("name", help="the stage's name in the breakdown")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --")
    if "\t" in args.name or "\n" in args.name:
        parser.error("the stage name may not hold a tab or a newline")
    args.log.parent.mkdir(parents=True, exist_ok=True)
    started, start = time.time(), time.monotonic()
    if args.output is None:
        status = subprocess.call(command)
    else:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        print(f"stage {args.name} runs beside the others; its output goes to {args.output}, "
              "printed here when it ends", flush=True)
        with args.output.open("wb") as out:
            status = subprocess.call(command, stdout=out, stderr=subprocess.STDOUT)
        sys.stdout.write(f"---- stage {args.name}: its output ({args.output}) ----\n")
        sys.stdout.write(args.output.read_text(errors="replace"))
        sys.stdout.write(f"---- end of stage {args.name}'s output ----\n")
    seconds = time.monotonic() - start
    with args.log.open("a") as log:
        log.write(f"{args.name}\t{seconds:.1f}\t{status}\t{started:.1f}\t{started + seconds:.1f}\n")
    print(f"stage {args.name}: {seconds:.0f} s" + ("" if status == 0 else f" (failed, exit status {status})"),
          flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
