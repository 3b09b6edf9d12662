"""The dev container (.devcontainer/devcontainer.json) builds the environment `make setup` builds.

Docker cannot run here, so these tests check the definition: strict JSON, a Python image the
book supports, and commands that are the Makefile's own targets.
"""

import json
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIG = json.loads((ROOT / ".devcontainer" / "devcontainer.json").read_text())


def _make_targets() -> set[str]:
    return set(re.findall(r"^([a-z][a-z-]*):", (ROOT / "Makefile").read_text(), flags=re.M))


def test_image_is_a_python_the_book_supports():
    image = CONFIG["image"]
    match = re.fullmatch(r"mcr\.microsoft\.com/devcontainers/python:(?:\d+-)?(\d+)\.(\d+)(?:-\w+)?", image)
    assert match, f"expected a devcontainers Python image with its version in the tag, got {image}"
    assert (int(match[1]), int(match[2])) >= (3, 10)
    assert 'requires-python = ">=3.10"' in (ROOT / "pyproject.toml").read_text()


def test_post_create_runs_make_setup():
    command = CONFIG["postCreateCommand"]
    assert command == "make setup"
    assert "setup" in _make_targets()


def test_every_command_is_a_make_target():
    keys = ("onCreateCommand", "updateContentCommand", "postCreateCommand", "postStartCommand", "postAttachCommand")
    targets = _make_targets()
    for key in keys:
        if key in CONFIG:
            words = CONFIG[key].split()
            assert words[0] == "make" and all(w in targets for w in words[1:]), f"{key}: {CONFIG[key]!r}"


def test_torch_index_is_pytorch_cpu_build_and_make_uses_it():
    # the CPU build of the locked torch: the one the stored outputs were computed with, without CUDA's GB
    index = CONFIG["containerEnv"]["TORCH_INDEX"]
    assert index == "https://download.pytorch.org/whl/cpu"
    dry_run = subprocess.run(
        ["make", "-n", "-B", "setup", f"TORCH_INDEX={index}"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert f"--extra-index-url {index}" in dry_run


def test_jupyterlab_port_and_extensions():
    assert 8888 in CONFIG["forwardPorts"]
    assert "lab" in _make_targets()
    extensions = CONFIG["customizations"]["vscode"]["extensions"]
    assert {"ms-python.python", "ms-toolsai.jupyter"} <= set(extensions)
    interpreter = CONFIG["customizations"]["vscode"]["settings"]["python.defaultInterpreterPath"]
    assert interpreter.endswith("/.venv/bin/python")  # the venv `make setup` creates
