""".ci/install_venv.py: the venv installed from one resolution, in disjoint groups, two pip processes at a time."""

from __future__ import annotations

import importlib.util
import json
import stat
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("install_venv", ROOT / ".ci" / "install_venv.py")
install_venv = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(install_venv)


def _report(*names: str, versions: dict | None = None) -> dict:
    return {"install": [{"metadata": {"name": n, "version": (versions or {}).get(n, "1.0")},
                         "download_info": {"url": f"https://files/{n}.whl"}} for n in names]}


def test_the_largest_go_first_and_alone_and_every_package_once():
    files = install_venv.resolved_files(_report("numpy", "Torch", "jupyter_book", *[f"p{i}" for i in range(20)], "triton"))
    assert "jupyter-book" in files and "torch" in files  # names normalised as pip does
    order = install_venv.groups(files, size=8)
    assert order[:2] == [["https://files/Torch.whl"], ["https://files/triton.whl"]]
    assert [len(g) for g in order[2:]] == [8, 8, 6]
    flat = [url for group in order for url in group]
    assert sorted(flat) == sorted(files.values()), "each package installed exactly once"
    with pytest.raises(ValueError, match="at least one package"):
        install_venv.groups(files, size=0)


def _fake_python(tmp_path: Path, report: dict | None, installed: dict | None = None) -> tuple[Path, Path]:
    """A stand-in for the venv's python that logs each pip call and writes ``report`` when asked for one;
    asked for a package's version (``-c``), it prints ``installed[name]``."""
    log = tmp_path / "calls.jsonl"
    script = tmp_path / "python"
    script.write_text(f"""#!{sys.executable}
import json, re, sys
args = sys.argv[1:]
with open({str(log)!r}, "a") as f:
    f.write(json.dumps(args) + "\\n")
if args[0] == "-c":
    installed = json.loads({json.dumps(json.dumps(installed or {}))})
    name = re.search(r"version\\('([^']+)'\\)", args[1]).group(1)
    print(installed.get(name, ""))
    sys.exit(0 if name in installed else 1)
if "--report" in args:
    report = {json.dumps(report)!r}
    if report == "null":
        sys.exit(2)
    open(args[args.index("--report") + 1], "w").write(report)
""")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script, log


def _calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_one_resolution_then_no_deps_installs_then_pip_check(tmp_path):
    python, log = _fake_python(tmp_path, _report("torch", "numpy", "sphinx"))
    assert install_venv.main(["--python", str(python), "-r", "req.txt", "-c", "lock.txt"]) == 0
    calls = _calls(log)
    assert calls[0][:2] == ["-m", "pip"] and "--dry-run" in calls[0] and "-c" in calls[0]
    installs = [c for c in calls[1:] if c[2] == "install"]
    assert all("--no-deps" in c for c in installs)
    assert sorted(url for c in installs for url in c if url.startswith("https://")) == \
        sorted(f"https://files/{n}.whl" for n in ("torch", "numpy", "sphinx"))
    assert calls[-1][2] == "check"


def test_without_a_report_it_installs_in_one_process(tmp_path, capsys):
    python, log = _fake_python(tmp_path, None)
    assert install_venv.main(["--python", str(python), "-r", "req.txt", "-c", "lock.txt",
                              "--extra-index-url", "https://download.pytorch.org/whl/cpu"]) == 0
    calls = _calls(log)
    assert len(calls) == 2 and "--dry-run" not in calls[1] and "--no-deps" not in calls[1]
    assert calls[1][-2:] == ["--extra-index-url", "https://download.pytorch.org/whl/cpu"]
    assert "installing in one process instead" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        install_venv.main(["--python", str(python), "-r", "r", "-c", "c", "--jobs", "0"])


def test_early_pins_are_the_locked_versions_without_a_marker():
    lock = ("torch==2.13.0\n    # via -r requirements.txt\ntriton==3.7.1 ; sys_platform == 'linux'\n"
            "numpy==2.2.6 ; python_full_version < '3.11'\nTorch_Other==1.0\n")
    assert install_venv.early_pins(lock) == ["torch==2.13.0"]
    assert install_venv.early_pins(lock, ("triton",)) == []  # behind a marker: left to the resolution
    assert install_venv.early_pins("") == []


@pytest.mark.parametrize("installed, resolved, reinstalled", [
    ("2.13.0+cpu", "2.13.0+cpu", False),  # the resolver chose what the early install put there
    ("2.13.0+cpu", "2.13.0+cu130", True),  # another build (another index): the resolved file replaces it
])
def test_torch_installs_while_pip_resolves_and_is_not_installed_twice(tmp_path, installed, resolved, reinstalled):
    lock = tmp_path / "lock.txt"
    lock.write_text("torch==2.13.0\n    # via -r requirements.txt\nnumpy==2.2.6\n")
    python, log = _fake_python(tmp_path, _report("torch", "numpy", versions={"torch": resolved}),
                               installed={"torch": installed})
    assert install_venv.main(["--python", str(python), "-r", "req.txt", "-c", str(lock)]) == 0
    installs = [c for c in _calls(log) if c[:3] == ["-m", "pip", "install"] and "--dry-run" not in c]
    assert ["-m", "pip", "install", *install_venv.PIP_FLAGS, "--no-deps", "torch==2.13.0"] in installs
    urls = [url for c in installs for url in c if url.startswith("https://")]
    assert sorted(urls) == sorted(["https://files/numpy.whl"] + (["https://files/torch.whl"] if reinstalled else []))
