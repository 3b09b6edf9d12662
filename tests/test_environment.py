"""The locked environment: requirements.lock agrees with requirements.txt, and make installs from it.

requirements.lock is `uv pip compile --universal` output (make lock); these checks need no network.
"""

import os
import re
import subprocess
from itertools import product
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent

# The platforms the book supports (torch 2.13.0 has wheels for these; macOS means 14+ on Apple silicon).
PLATFORMS = {
    "linux-x86_64": {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix"},
    "linux-aarch64": {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "aarch64", "os_name": "posix"},
    "macos-arm64": {"sys_platform": "darwin", "platform_system": "Darwin", "platform_machine": "arm64", "os_name": "posix"},
    "windows-amd64": {"sys_platform": "win32", "platform_system": "Windows", "platform_machine": "AMD64", "os_name": "nt"},
}
PYTHONS = ("3.10", "3.11", "3.12", "3.13", "3.14")


def _environment(platform: str, python: str) -> dict[str, str]:
    return {
        **PLATFORMS[platform], "python_version": python, "python_full_version": f"{python}.0",
        "implementation_name": "cpython", "platform_python_implementation": "CPython",
        "implementation_version": f"{python}.0", "platform_release": "", "platform_version": "", "extra": "",
    }


def _requirements() -> list[Requirement]:
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    return [Requirement(line) for line in (raw.split(" #")[0].strip() for raw in lines) if line and not line.startswith("#")]


def _lock() -> list[tuple[str, str, Marker | None]]:
    """(name, version, marker) for every pin of requirements.lock."""
    pins = []
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if not line or line[0] in "# ":
            continue
        requirement = Requirement(line)
        (specifier,) = requirement.specifier
        assert specifier.operator == "==", f"not a pin: {line}"
        pins.append((_canonical(requirement.name), specifier.version, requirement.marker))
    return pins


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@pytest.mark.parametrize("platform,python", list(product(PLATFORMS, PYTHONS)))
def test_lock_pins_every_requirement_once(platform, python):
    env = _environment(platform, python)
    pinned: dict[str, str] = {}
    for name, version, marker in _lock():
        if marker is None or marker.evaluate(env):
            assert name not in pinned, f"{name} pinned twice on {platform}, Python {python}"
            pinned[name] = version
    for requirement in _requirements():
        name = _canonical(requirement.name)
        if requirement.marker is not None and not requirement.marker.evaluate(env):
            assert name not in pinned, f"{name} is locked on {platform} where requirements.txt leaves it out"
            continue
        assert name in pinned, f"{name} is in requirements.txt but not in requirements.lock: run `make lock`"
        assert requirement.specifier.contains(pinned[name], prereleases=True), (
            f"requirements.lock pins {name}=={pinned[name]}, outside requirements.txt's {requirement.specifier}: run `make lock`"
        )


def test_torch_is_the_book_version_and_triton_linux_only():
    requirements = {_canonical(r.name): r for r in _requirements()}
    assert str(requirements["torch"].specifier) == "==2.13.0"
    assert str(requirements["triton"].marker) == 'sys_platform == "linux"'
    lock = {name: (version, marker) for name, version, marker in _lock()}
    assert lock["torch"] == ("2.13.0", None)
    assert lock["triton"][1] is not None and str(lock["triton"][1]) == 'sys_platform == "linux"'


def _dry_run(*args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_INDEX", "MAKEFLAGS", "MAKELEVEL")}
    return subprocess.run(["make", "-n", "-B", *args], cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout


def test_make_setup_installs_with_the_lock_as_constraints():
    installs = [line for line in _dry_run("setup").splitlines() if "pip install" in line or "install_venv.py" in line]
    # .ci/install_venv.py: pip's own resolution of exactly these arguments, installed two processes at a time
    assert any("install_venv.py" in line and "-r requirements.txt -c requirements.lock" in line for line in installs), installs
    # the lock as constraints, never as requirements: -r would install torch's CUDA packages on Linux
    assert not any("-r requirements.lock" in line for line in installs)
    assert re.search(r"^\$\(STAMP\):.*\$\(LOCK\)", (ROOT / "Makefile").read_text(), flags=re.M), (
        "the venv must be reinstalled when the lock changes"
    )


def test_make_lock_runs_uv_compile_with_the_locks_flags():
    compile_line = " ".join(_dry_run("lock").split())
    assert "uv pip compile requirements.txt --universal --python-version 3.10" in compile_line
    assert "-o requirements.lock" in compile_line
    assert "# This file was autogenerated by uv via the following command:\n#    make lock" in (
        ROOT / "requirements.lock"
    ).read_text()
