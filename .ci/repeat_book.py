"""Build the book several times in a row from a clean ``_build`` and report any stall.

    python .ci/repeat_book.py --runs 5          # five clean `make book EXECUTE=1` builds (`make book-repeat`)
    python .ci/repeat_book.py --runs 3 book     # the default build, from the stored outputs

Each run deletes ``_build`` (the jupyter-cache included, so every notebook is
executed again), runs ``make <make args>`` and streams its output with a time
stamp per line into ``<log dir>/run-<k>.log``. Two kinds of trouble are reported:

* a *stall*: the build prints nothing for ``--stall-seconds``. The script then
  records the process tree with each process's CPU seconds (a stalled client and
  kernel both sit idle) and, if ``py-spy`` is installed, every Python process's
  stack; it kills the build and goes on with the next run;
* a *slow notebook*: myst-nb's "Executed notebook in N seconds" above
  ``--slow-notebook-seconds``. A lost wake-up in the Jupyter client (README, "Why
  the live-widget cells are not executed by the book build") does not hang for
  ever: the client finds the reply when its cell timeout expires, so the symptom
  is a notebook that took one cell timeout longer than usual.

At the end it prints one line per run (ok, slow, failed or stalled, the wall
time and the slowest notebook) and exits with 1 if any run was not ok.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _process_tree(root_pid: int) -> list[tuple[int, int, str, float]]:
    """(pid, parent pid, command, CPU seconds) of ``root_pid`` and all its descendants, from /proc."""
    table = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        ppid, utime, stime = int(fields[1]), int(fields[11]), int(fields[12])
        table[int(entry.name)] = (ppid, cmd, (utime + stime) / tick)
    tree, frontier = [], [root_pid]
    while frontier:
        pid = frontier.pop()
        if pid in table:
            ppid, cmd, cpu = table[pid]
            tree.append((pid, ppid, cmd, cpu))
        frontier += [child for child, (parent, _, _) in table.items() if parent == pid]
    return tree


def _report_stall(pid: int, log) -> None:
    log.write(f"\n=== STALL: no output for a while; process tree (pid, ppid, CPU s, command) ===\n")
    for p, pp, cmd, cpu in _process_tree(pid):
        log.write(f"{p:>7} {pp:>7} {cpu:8.2f}  {cmd[:160]}\n")
        if shutil.which("py-spy") and "python" in cmd:
            dump = subprocess.run(["py-spy", "dump", "--pid", str(p)], capture_output=True, text=True)
            log.write(dump.stdout + dump.stderr)
    log.flush()


EXECUTED = re.compile(r"(\S+\.ipynb): Executed notebook in ([0-9.]+) seconds")


def run_once(k: int, make_args: list[str], stall_seconds: float, log_dir: Path) -> tuple[str, float, list]:
    """One clean build; returns ("ok" | "failed" | "stalled", wall seconds, [(seconds, notebook), ...])."""
    shutil.rmtree(ROOT / "_build", ignore_errors=True)
    path = log_dir / f"run-{k}.log"
    start = time.monotonic()
    last_output = [time.monotonic()]
    with path.open("w") as log:
        proc = subprocess.Popen(["make", *make_args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, bufsize=1, start_new_session=True)

        def pump() -> None:
            for line in proc.stdout:
                last_output[0] = time.monotonic()
                log.write(f"[{time.monotonic() - start:7.1f}s] {line}")
                log.flush()

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        stalled = False
        while proc.poll() is None:
            time.sleep(1)
            if time.monotonic() - last_output[0] > stall_seconds:
                stalled = True
                _report_stall(proc.pid, log)
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        reader.join(5)
    wall = time.monotonic() - start
    executed = sorted(((float(t), Path(nb).name) for nb, t in EXECUTED.findall(path.read_text())), reverse=True)
    return ("stalled" if stalled else "ok" if proc.returncode == 0 else "failed"), wall, executed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("make_args", nargs="*", default=["book", "EXECUTE=1"],
                        help="what to pass to make (default: book EXECUTE=1)")
    parser.add_argument("--stall-seconds", type=float, default=300.0,
                        help="a run that prints nothing for this long counts as stalled")
    parser.add_argument("--slow-notebook-seconds", type=float, default=90.0,
                        help="a notebook that executes for longer than this makes the run 'slow'")
    parser.add_argument("--log-dir", type=Path, default=None, help="where run logs go (default: a temp folder)")
    args = parser.parse_args(argv)
    if args.runs < 1:
        raise ValueError(f"--runs must be at least 1, got {args.runs}")
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="repeat-book-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for k in range(1, args.runs + 1):
        outcome, wall, executed = run_once(k, args.make_args, args.stall_seconds, log_dir)
        if outcome == "ok" and executed and executed[0][0] > args.slow_notebook_seconds:
            outcome = "slow"
        results.append(outcome)
        slowest = f"slowest notebook {executed[0][1]} {executed[0][0]:.0f} s, " if executed else ""
        print(f"run {k}/{args.runs}: {outcome:8s} {wall / 60:5.1f} min, {len(executed)} notebooks executed, "
              f"{slowest}log {log_dir / f'run-{k}.log'}", flush=True)
    bad = [r for r in results if r != "ok"]
    print(f"{len(results) - len(bad)} of {len(results)} builds succeeded" + (f"; {bad}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
