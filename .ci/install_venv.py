"""Install the book's locked environment into a venv, two pip processes at a time (the venv's setup stage).

    python .ci/install_venv.py --python .venv/bin/python -r requirements.txt -c requirements.lock [--extra-index-url URL]

The same packages, at the same versions, as

    pip install -r requirements.txt -c requirements.lock

but about a third faster on a 2-core machine: pip unpacks and byte-compiles one package at a time, and
that, not the download, is most of an install. So pip first resolves the environment without installing
anything (``--dry-run --report``: the exact file of every package this platform needs and the venv lacks,
which also fills pip's download cache); then the files are installed in groups with ``--no-deps``, ``JOBS`` pip processes
at a time, the largest (torch) first. The groups are disjoint, so no two processes write the same files.
``pip check`` then confirms that every installed package has what it needs.

The resolution is mostly waiting on the network, one process. Meanwhile torch, pinned in the lock, is
already installed at its locked version (:func:`early_pins`): after the resolution, if the version the
resolver chose is the one installed (local label included, ``2.13.0+cpu``), it is not installed again;
if not (another index, another build), the resolved file replaces it.

If pip cannot write the report (a pip older than 22.2), the plain one-process install runs instead.
Standard library only: it runs before the venv has anything in it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# pip's own quiet flags for every call.
PIP_FLAGS = ["-q", "--disable-pip-version-check"]
# Packages installed per pip process after the largest ones: enough to amortise pip's start (about half a
# second), few enough that the two processes finish together.
GROUP_SIZE = 16
# Installed alone and first: these take the longest to unpack (hundreds of MB).
LARGEST = ("torch", "triton")


def groups(urls_by_name: dict[str, str], size: int = GROUP_SIZE) -> list[list[str]]:
    """The install order: each of the LARGEST packages alone, then the others in groups of ``size``."""
    if size < 1:
        raise ValueError(f"a group holds at least one package, got size={size}")
    first = [[urls_by_name[name]] for name in LARGEST if name in urls_by_name]
    rest = [url for name, url in urls_by_name.items() if name not in LARGEST]
    return first + [rest[i:i + size] for i in range(0, len(rest), size)]


EARLY = ("torch",)
"""Installed while pip resolves the rest, from their pins in the lock: the longest single install."""


def early_pins(lock_text: str, names: tuple[str, ...] = EARLY) -> list[str]:
    """``name==version`` of each of ``names`` that the lock pins for every platform (a line with no marker).

    A pin behind an environment marker (``; sys_platform == 'linux'``) is left to the resolution.
    """
    pins = []
    for line in lock_text.splitlines():
        spec = line.split("#", 1)[0].strip()
        if ";" in spec or "==" not in spec:
            continue
        name, version = (part.strip() for part in spec.split("==", 1))
        if name.lower().replace("_", "-") in names:
            pins.append(f"{name}=={version}")
    return pins


def resolved_versions(report: dict) -> dict[str, str]:
    """``{name: version}`` of every package in a ``pip install --report`` (its ``install`` list)."""
    return {item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"] for item in report["install"]}


def installed_version(python: str, name: str) -> str | None:
    """The version of ``name`` installed in ``python``'s environment, or None."""
    done = subprocess.run([python, "-c", f"import importlib.metadata as m; print(m.version({name!r}))"],
                          capture_output=True, text=True)
    return (done.stdout.strip() or None) if done.returncode == 0 else None


def resolved_files(report: dict) -> dict[str, str]:
    """``{name: url}`` of every package in a ``pip install --report`` (its ``install`` list)."""
    files = {}
    for item in report["install"]:
        name = item["metadata"]["name"].lower().replace("_", "-")
        files[name] = item["download_info"]["url"]
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", required=True, help="the venv's python")
    parser.add_argument("-r", dest="requirements", required=True, help="requirements file")
    parser.add_argument("-c", dest="constraints", required=True, help="the lock, as constraints")
    parser.add_argument("--extra-index-url", default="", help="another index (PyTorch's, for its CPU or CUDA build)")
    parser.add_argument("--jobs", type=int, default=2, help="pip processes at a time")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    pip = [args.python, "-m", "pip"]
    index = ["--extra-index-url", args.extra_index_url] if args.extra_index_url else []
    what = ["-r", args.requirements, "-c", args.constraints, *index]
    early_pip = ThreadPoolExecutor(1)  # torch installs while pip resolves the rest
    try:
        lock_text = Path(args.constraints).read_text()
    except OSError:
        lock_text = ""
    pins = early_pins(lock_text)
    early = early_pip.submit(subprocess.call, [*pip, "install", *PIP_FLAGS, "--no-deps", *index, *pins]) if pins \
        else None
    with tempfile.TemporaryDirectory() as folder:
        report_path = Path(folder) / "report.json"
        resolve = subprocess.run([*pip, "install", *PIP_FLAGS, "--dry-run", "--report", str(report_path), *what])
        early_ok = early is not None and early.result() == 0
        early_pip.shutdown()
        if resolve.returncode != 0 or not report_path.is_file():
            print("install_venv: pip could not write a resolution report; installing in one process instead",
                  flush=True)
            return subprocess.call([*pip, "install", *PIP_FLAGS, *what])
        report = json.loads(report_path.read_text())
        files, versions = resolved_files(report), resolved_versions(report)
    for pin in pins if early_ok else []:
        name = pin.split("==")[0].lower().replace("_", "-")
        if name in files and installed_version(args.python, name) == versions[name]:
            del files[name]  # the resolver chose what is already there
            print(f"install_venv: {name} {versions[name]} was installed while pip resolved", flush=True)

    def install(urls: list[str]) -> int:
        return subprocess.call([*pip, "install", *PIP_FLAGS, "--no-deps", *index, *urls])

    with ThreadPoolExecutor(args.jobs) as pool:
        statuses = list(pool.map(install, groups(files)))
    if any(statuses):
        print(f"install_venv: {sum(1 for s in statuses if s)} of {len(statuses)} pip installs failed (see above)",
              file=sys.stderr)
        return 1
    return subprocess.call([*pip, "check"])


if __name__ == "__main__":
    sys.exit(main())
