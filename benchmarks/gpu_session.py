"""Everything a short GPU lease should do, in one command: sweep, record, run every notebook, within a deadline.

Run from the repository root on a CUDA machine (torch and triton, no Jupyter)::

    python -m benchmarks.gpu_session --out OUT --deadline 540
    python -m benchmarks.gpu_session --out OUT --steps notebooks --notebooks labs/03-attention/*.ipynb
    python -m benchmarks.gpu_session --out /tmp/s --allow-cpu --quick    # a smoke test of the steps, no GPU

Steps, in order (``--steps`` picks some), each a child process stopped at the shared deadline:

1. ``env``: ``nvidia-smi`` and the versions, at the top of ``OUT/session.log``;
2. ``sweep``: ``python -m benchmarks.hopper_kernels --sweep-only OUT/hopper_sweep.txt``: tiles, warps and
   stages of the persistent matmul (fp16, fp8) and of the FlashAttention forward and backward;
3. ``record``: ``python -m benchmarks --record OUT``: every harness case, ``OUT/<gpu>.json`` and its roofline;
4. ``profile``: Nsight Compute (``ncu``, where installed) over one launch of the TMA FlashAttention forward
   and of SDPA's cuDNN attention (``benchmarks.profile_flash``), to ``OUT/profile.txt``;
5. ``production``: ``python -m benchmarks.production_recordings``, part 6's recordings (a CUDA trace of a
   training step, a memory snapshot, Inductor's Triton for the compilers chapter's block, the block with and
   without CUDA graphs), to ``OUT/production.tar.gz``;
6. ``notebooks``: ``python -m benchmarks.notebooks`` over every notebook, ``--jobs`` at a time; the summary
   to ``OUT/notebooks.txt`` and the logs to ``OUT/notebook-logs.tar.gz``.

Everything printed also goes to ``OUT/session.log``. The exit code is 0 when every step ran to the end and
passed, 1 otherwise (the log says which). Eight files at most land in ``OUT``, as a lease returns them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

STEPS = ("env", "sweep", "record", "profile", "production", "notebooks")


def _run(cmd: list[str], log, deadline: float, reserve: float = 0.0) -> int:
    """Run ``cmd`` with its output copied to stdout and ``log``; stop it ``reserve`` seconds before the deadline."""
    timeout = deadline - reserve - time.time()
    print(f"\n$ {' '.join(cmd)}   (at most {timeout:.0f} s)", flush=True)
    log.write(f"\n$ {' '.join(cmd)}\n")
    if timeout <= 5:
        print("skipped: no time left before the deadline", flush=True)
        return 124
    env = os.environ | {"PYTHONUNBUFFERED": "1", "MPLBACKEND": "agg"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    start = time.time()
    assert proc.stdout is not None
    os.set_blocking(proc.stdout.fileno(), False)
    while True:
        line = proc.stdout.readline()
        if line:
            sys.stdout.write(line)
            log.write(line)
            continue
        if proc.poll() is not None:
            rest = proc.stdout.read() or ""
            sys.stdout.write(rest)
            log.write(rest)
            break
        if time.time() - start > timeout:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
            print(f"stopped at the deadline after {time.time() - start:.0f} s", flush=True)
            return 124
        time.sleep(0.05)
    print(f"(exit code {proc.returncode}, {time.time() - start:.0f} s)", flush=True)
    log.flush()
    return proc.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_session", description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="folder for the results (a lease's $OUT)")
    parser.add_argument("--deadline", type=float, default=540, help="seconds for all steps (default 540)")
    parser.add_argument("--steps", nargs="+", choices=STEPS, default=list(STEPS))
    parser.add_argument("--notebooks", nargs="*", default=None, help="notebooks to run (default: all)")
    parser.add_argument("--jobs", type=int, default=8, help="notebooks at once (default 8)")
    parser.add_argument("--notebook-timeout", type=float, default=240, help="seconds per notebook (default 240)")
    parser.add_argument("--allow-cpu", action="store_true", help="smoke-test the steps without a GPU")
    parser.add_argument("--quick", action="store_true", help="the harness's smaller sizes")
    args = parser.parse_args(argv)
    if args.deadline <= 0 or args.jobs < 1:
        raise ValueError(f"--deadline must be > 0 and --jobs >= 1, got {args.deadline} and {args.jobs}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.time() + args.deadline
    py = sys.executable
    codes: dict[str, int] = {}
    with open(out / "session.log", "w") as log:
        if "env" in args.steps:
            info = subprocess.run("nvidia-smi; python3 -c 'import torch, triton, sys; print(sys.version); "
                                  "print(torch.__version__, torch.version.cuda, triton.__version__)'; "
                                  "echo profilers: $(command -v ncu nsys)",
                                  shell=True, capture_output=True, text=True, timeout=60)
            log.write(info.stdout + info.stderr)
            print(info.stdout[-1500:], flush=True)
            codes["env"] = 0
        extra = (["--allow-cpu"] if args.allow_cpu else []) + (["--quick"] if args.quick else [])
        if "sweep" in args.steps:
            if args.allow_cpu:
                print("sweep: needs a GPU, skipped with --allow-cpu", flush=True)
            else:
                codes["sweep"] = _run([py, "-m", "benchmarks.hopper_kernels", "--sweep-only",
                                       str(out / "hopper_sweep.txt")], log, deadline,
                                      reserve=280 if "record" in args.steps else 0)
        if "record" in args.steps:
            codes["record"] = _run([py, "-m", "benchmarks", "--record", str(out)] + extra, log, deadline,
                                   reserve=120 if "notebooks" in args.steps else 0)
        if "profile" in args.steps:
            if args.allow_cpu:
                print("profile: needs a GPU, skipped with --allow-cpu", flush=True)
            else:
                ncu = shutil.which("ncu")
                cmd = [py, "-m", "benchmarks.profile_flash"]
                if ncu:
                    cmd = [ncu, "--nvtx", "--nvtx-include", "tma_forward/", "--nvtx-include", "cudnn_forward/",
                           "--section", "SpeedOfLight", "--section", "ComputeWorkloadAnalysis", "--section",
                           "WarpStateStats", "--section", "SchedulerStats", "--section", "InstructionStats"] + cmd
                with open(out / "profile.txt", "w") as profile:
                    codes["profile"] = _run(cmd, profile, deadline, reserve=240 if "notebooks" in args.steps else 0)
        if "production" in args.steps:
            recordings = Path("_build/production-recordings")
            shutil.rmtree(recordings, ignore_errors=True)
            codes["production"] = _run([py, "-m", "benchmarks.production_recordings", "--out", str(recordings)]
                                       + (["--allow-cpu"] if args.allow_cpu else []), log, deadline,
                                       reserve=180 if "notebooks" in args.steps else 0)
            with tarfile.open(out / "production.tar.gz", "w:gz") as tar:
                for f in sorted(recordings.glob("*")):
                    tar.add(f, arcname=f.name)
        if "notebooks" in args.steps:
            log_dir = Path("_build/notebook-logs")
            remaining = deadline - time.time() - 10
            with open(out / "notebooks.txt", "w") as summary:
                cmd = [py, "-m", "benchmarks.notebooks", "--jobs", str(args.jobs), "--timeout",
                       str(args.notebook_timeout), "--deadline", str(max(remaining, 1)), "--log-dir", str(log_dir)]
                codes["notebooks"] = _run(cmd + (args.notebooks or []), summary, deadline)  # none: every notebook
            with tarfile.open(out / "notebook-logs.tar.gz", "w:gz") as tar:
                for f in sorted(log_dir.glob("*.log")):
                    tar.add(f, arcname=f.name)
        summary = ", ".join(f"{step} {'ok' if code == 0 else f'exit {code}'}" for step, code in codes.items())
        print(f"\ngpu_session: {summary}", flush=True)
        log.write(f"\ngpu_session: {summary}\n")
    return 0 if all(code == 0 for code in codes.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
