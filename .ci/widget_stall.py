"""Reproduce the lost wake-up behind issue 7: nbclient stalls on ipywidgets cells for a whole cell timeout.

    .venv/bin/python .ci/widget_stall.py                 # 150 cells of each kind, about 6 min
    .venv/bin/python .ci/widget_stall.py --busy 0        # the same on an otherwise idle machine

It writes three notebooks to a temporary folder and executes each with nbclient
(the client that `make book EXECUTE=1` and `make execute` use), with a short
cell timeout, while ``--busy`` processes spin on the CPU (the race needs the
client to be slow to react, as on a loaded 2-core machine), counting the cells that took longer than ``--stall-seconds``:

* ``widgets``: cells that each return an ``ipywidgets.interactive`` (an Output
  widget, which nbclient mimics by sending ``comm_msg`` on the shell socket);
* ``no-mimic``: the same cells, with nbclient's Output-widget mimic switched off
  (``client.widget_registry = {}``), so the client never sends on the shell socket;
* ``plain``: the same figure drawn without a widget.

At every stall it records whether the client's shell socket holds an unread
message (``zmq.POLLIN``): the ``execute_reply`` that the asyncio poll was not
woken for. A stalled cell completes when its timeout expires. On 2026-11-23 (2-core
machine, pyzmq 27.3.0, jupyter_client 8.10.0, nbclient 0.11.0, ipykernel 7.4.0),
with two busy processes beside it (the default), 150 cells gave 20 stalls with
widgets, the reply already waiting at all 20, and none without the mimic or
without widgets; with other builds beside it, 600 cells gave 13, 0 and 0; on an
idle machine (``--busy 0``), 200 cells of each kind gave no stall at all. If a future release shows no stall in ``widgets``, the live-widget cells
could be executed by the book build again (README, "Why the live-widget cells ...").
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import nbformat
import zmq
from nbclient import NotebookClient

SETUP = """import ipywidgets
import matplotlib.pyplot as plt
%matplotlib inline
def draw(n=3):
    fig, ax = plt.subplots(figsize=(1, 1), dpi=20)
    ax.plot(range(n))
    plt.show()"""
CELLS = {"widgets": "ipywidgets.interactive(draw, n=(1, 10))", "no-mimic": "ipywidgets.interactive(draw, n=(1, 10))",
         "plain": "draw()"}


class _TimedClient(NotebookClient):
    """nbclient's client, timing each cell and peeking at the shell socket when a cell runs long."""

    stall_seconds = 5.0

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.stalls: list[tuple[int, float, bool]] = []
        self._running: tuple[int, float] | None = None
        self._pending: dict[int, bool] = {}

    async def async_execute_cell(self, cell, cell_index, execution_count=None, store_history=True):
        self._running = (cell_index, time.monotonic())
        out = await super().async_execute_cell(cell, cell_index, execution_count, store_history)
        seconds = time.monotonic() - self._running[1]
        if seconds > self.stall_seconds:
            self.stalls.append((cell_index, seconds, self._pending.get(cell_index, False)))
        self._running = None
        return out

    def watch(self) -> None:
        """Background thread: once per cell that runs long, ask libzmq whether a reply is waiting."""
        while True:
            time.sleep(0.5)
            running = self._running
            if running and time.monotonic() - running[1] > self.stall_seconds and running[0] not in self._pending:
                shell = zmq.Socket.shadow(self.kc.shell_channel.socket.underlying)
                self._pending[running[0]] = bool(shell.get(zmq.EVENTS) & zmq.POLLIN)


def run(kind: str, n_cells: int, stall_seconds: float, folder: Path) -> list[tuple[int, float, bool]]:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(SETUP)] + [nbformat.v4.new_code_cell(CELLS[kind]) for _ in range(n_cells)]
    client = _TimedClient(nb, timeout=int(3 * stall_seconds), resources={"metadata": {"path": str(folder)}})
    client.stall_seconds = stall_seconds
    if kind == "no-mimic":
        client.widget_registry = {}
    threading.Thread(target=client.watch, daemon=True).start()
    client.execute()
    return client.stalls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--cells", type=int, default=150)
    parser.add_argument("--busy", type=int, default=2, help="processes that keep the CPU busy meanwhile")
    parser.add_argument("--stall-seconds", type=float, default=5.0,
                        help="a cell slower than this counts as stalled; the cell timeout is 3x this")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    with tempfile.TemporaryDirectory() as tmp:
        for kind in CELLS:
            stalls = []
            for _ in range(args.runs):
                stalls += run(kind, args.cells, args.stall_seconds, Path(tmp))
            waiting = sum(pending for _, _, pending in stalls)
            print(f"{kind:>9}: {len(stalls)} of {args.runs * args.cells} cells stalled; "
                  f"at {waiting} of those stalls the reply was already waiting in the shell socket", flush=True)
    for p in spinners:
        p.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
