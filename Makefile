# The book's commands. Each one creates .venv and installs what it needs first.
#   make book            build the HTML book into _build/html from the notebooks' stored outputs
#                        (the outputs that `make test` checks against a fresh run)
#   make book EXECUTE=1  execute every notebook first (myst-nb's jupyter-cache client, JOBS at a time),
#                        then build _build/html from the cache
#   make test            unit tests, `make book` with warnings as errors, every notebook executed once
#                        into the build's cache (the execution of `make book EXECUTE=1`, from a clean
#                        _build), its checked outputs compared with the stored ones (`make check-outputs`),
#                        then `make links` and `make browser` over the book `make book` built
#   make nbval           nbval over every notebook: the same comparison, in a second execution
#   make lab             JupyterLab in the book's environment
#   make nbval-portable  nbval on another CPU code path and thread count (AVX2 kernels, 2 threads):
#                        a checked output that fails here is not portable (README, "Writing a page")
#   make notebooks-without-triton  every notebook run top to bottom with triton unimportable, as on
#                        macOS and Windows (.ci/run_without_triton.py; nothing is written back)
#   make execute         re-execute every notebook in place, so stored outputs are fresh
#   make book-repeat     `make book EXECUTE=1` RUNS times from a clean _build, reporting any stall
#   make slowest         where the last `make test` spent its time: each stage, and the ten slowest
#                        notebooks, cells, unit tests and browser tests (.ci/timings.py; reports only)
#   make student         the student edition of the labs (no solutions) in _build/student/labs
#   make lock            regenerate requirements.lock from requirements.txt (UPGRADE=1: newest versions)
#   make clean           remove _build, the vendored MathJax and .cache (trained models, timings)

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
JOBS ?= 2
EXECUTE ?= 0
RUNS ?= 5
# Seconds one cell may run before the build fails: the slowest notebooks take about a minute on a 2-core CPU.
CELL_TIMEOUT ?= 180
NOTEBOOKS := $(shell find chapters labs -name '*.ipynb' -not -path '*/.ipynb_checkpoints/*' | sort)
# Threads per process: keep nbval's parallel kernels from fighting over the cores.
export OMP_NUM_THREADS ?= 1
export PYDEVD_DISABLE_FILE_VALIDATION := 1
# Notebooks run by these targets have no one watching: utils.progress prints one line, not a live bar
# (unset for `make lab`).
export BOOK_BATCH_EXECUTION := 1

.PHONY: setup lock book test unit nbval nbval-portable notebooks-without-triton check-outputs lab execute book-repeat clean links browser slowest
# Where `make test` leaves its timings (.ci/stage.py, .ci/execute_cache.py --timings, pytest's JUnit
# reports) for `make slowest`; the trained-model cache (utils.train_once) is .cache/trained.
TIMINGS := .cache/timings
STAGE := $(PYTHON) .ci/stage.py --log $(TIMINGS)/stages.tsv
MATHJAX := _mathjax/mathjax

# The environment is locked. requirements.txt says what the book needs; requirements.lock pins every
# package and everything it depends on, for every platform the book supports, and the venv is installed
# from requirements.txt with the lock as constraints (-c): each package at its locked version, and
# only the packages this platform needs. (Installing the lock itself, -r, would install torch's CUDA
# dependencies on Linux even beside the CPU build of torch.) TORCH_INDEX=https://download.pytorch.org/whl/cpu
# (or .../cu130, the CUDA build) adds PyTorch's own index, which has the locked torch version built for
# that device (README, "Setup"); the dev container sets the CPU one.
# .ci/install_venv.py installs exactly what `pip install -r requirements.txt -c $(LOCK)` would, from one
# resolution, two pip processes at a time (about a third faster on 2 cores).
LOCK := requirements.lock
TORCH_INDEX ?=
$(STAMP): requirements.txt $(LOCK) pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PYTHON) .ci/install_venv.py --python $(BIN)/python --jobs $(JOBS) -r requirements.txt -c $(LOCK) \
		$(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $(STAMP)

setup: $(STAMP)

# Regenerate the lock: uv's resolver (`uv pip compile`), run as
#   uv pip compile requirements.txt --universal --python-version 3.10 -o requirements.lock
# --universal writes one file for every platform (environment markers where a pin differs: numpy and
# ipython on Python 3.10, triton and torch's CUDA packages on Linux only), --python-version 3.10 the
# oldest Python the book supports (--no-python-downloads: uv resolves for 3.10 without fetching one;
# every locked package has wheels). The pins already in requirements.lock are kept where requirements.txt
# still allows them, so editing one line of requirements.txt moves only what it must; UPGRADE=1 adds
# --upgrade (newest versions of everything). uv is installed, at a fixed version, in .venv-lock.
UV_VERSION := 0.13.9
UV := .venv-lock/bin/uv
$(UV):
	$(PYTHON) -m venv .venv-lock
	.venv-lock/bin/python -m pip install -q --disable-pip-version-check uv==$(UV_VERSION)

lock: $(UV)
	$(UV) pip compile requirements.txt --universal --python-version 3.10 --no-python-downloads \
		--custom-compile-command "make lock" $(if $(filter 1,$(UPGRADE)),--upgrade) -o $(LOCK) >/dev/null

# MathJax served from the book itself (sphinx mathjax_path in _config.yml), so math renders offline.
$(MATHJAX)/tex-mml-chtml.js: $(STAMP)
	rm -rf $(MATHJAX) && mkdir -p $(MATHJAX)
	src=$$($(BIN)/python -c "import mathjax, pathlib; print(pathlib.Path(mathjax.__file__).parent / 'static/mathjax/es5')") && \
		cp -r $$src/tex-mml-chtml.js $$src/output $$src/input $$src/ui $$src/a11y $$src/adaptors $(MATHJAX)/

# _config.yml builds from the stored outputs (execute_notebooks: "off"). EXECUTE=1 builds with a copy
# of it that says `cache`: myst-nb executes every notebook not yet in _build/.jupyter_cache through
# jupyter-cache and nbclient, each cell failing after CELL_TIMEOUT seconds. Sphinx does that one
# notebook at a time, so first .ci/execute_cache.py runs myst-nb's same cache client on the
# notebooks, JOBS at a time, with the settings read from that same copy; the build then finds
# every notebook in the cache ("Using cached notebook") and only renders. A cell error, a cell
# past CELL_TIMEOUT or a dead kernel stops make there, naming the notebook. Cells tagged
# skip-execution (the live widgets, which need a kernel and are removed from the HTML anyway) are
# not run: see README, "Why the live-widget cells are not executed by the book build".
BOOK_CONFIG := _build/config/$(if $(filter 1,$(EXECUTE)),execute,stored).yml
# $(call book_config,MODE,FILE): _config.yml with execute_notebooks set to MODE ("cache" or "off") and
# the cell timeout set to CELL_TIMEOUT, written to FILE.
book_config = mkdir -p _build/config && sed -e 's/^\(  *execute_notebooks:\).*/\1 $(1)/' \
	-e 's/^\(  *timeout:\).*/\1 $(CELL_TIMEOUT)/' _config.yml > $(2)
# Where the build goes: $(BOOK_OUT)/_build/html.
BOOK_OUT ?= .
book: $(STAMP) $(MATHJAX)/tex-mml-chtml.js
	$(call book_config,$(if $(filter 1,$(EXECUTE)),cache,"off"),$(BOOK_CONFIG))
ifeq ($(EXECUTE),1)
	$(BIN)/python .ci/execute_cache.py --config $(BOOK_CONFIG) --build-dir _build --jobs $(JOBS) \
		--timings $(TIMINGS)/notebooks.json $(NOTEBOOKS)
endif
	$(BIN)/jupyter-book build . --config $(BOOK_CONFIG) --path-output $(BOOK_OUT) -W --keep-going
	@echo "Open $(BOOK_OUT)/_build/html/index.html"

# Each notebook runs once. After the setup stage three lanes run side by side, so that both cores stay
# busy where one alone leaves a core idle (notebooks and tests that wait, the tail of each lane):
#   - the notebooks: from a clean _build every notebook runs through myst-nb's cache
#     (.ci/execute_cache.py, JOBS at a time), the build's own execution path, each lab with its
#     student edition checked inside that one execution (--student-checks: before each exercise's
#     solution the kernel forks and runs the student edition from there, utils/student_probe.py;
#     the unit tests, told so by BOOK_STUDENT_CHECKS=execute, do not run the labs again); then check-outputs
#     compares the cells tagged nbval-check-output with the stored outputs by nbval's rules
#     (.ci/check_outputs.py), reading the executed notebooks from that cache;
#   - the unit tests (their output is printed in one piece when they end);
#   - the site: `make book` exactly as a reader runs it (the stored outputs, -W, into _build/html:
#     what a reader opens), then the link check; the browser suite tests that HTML once the
#     notebooks have run, beside the unit tests' tail.
# The stored outputs are what the HTML shows, and check-outputs ties them to this run's execution, so
# the executed notebooks are not rendered a second time (until 2026-11-29 make test built both: the
# same pages twice, about 2 min of one core). `make book EXECUTE=1`, the render from the cache, is
# tested on small notebooks by tests/test_ci_execute_cache.py.
# On Linux their kernels are forked from a process that has imported torch once (JUPYTER_PATH puts the
# kernel spec .ci/jupyter/kernels/python3 first: utils/forked_kernels.py), not started afresh each time;
# elsewhere (macOS: forking after the Accelerate framework is loaded is unsafe) they start as usual.
FORKED_KERNELS := $(if $(filter Linux,$(shell uname -s)),JUPYTER_PATH=$(CURDIR)/.ci/jupyter)
# Each stage's wall time, start and end go to $(TIMINGS); the breakdown is printed at the end (`make
# slowest` adds the slowest notebooks, cells and tests). A failing stage fails make test after the
# others have ended. The setup stage installs Chromium (for `make browser`) beside the venv when it is
# missing, and vendors MathJax. The trained models in .cache/trained are kept: they are keyed by the
# code that trains them (utils.train_once), so they cannot be stale.
test:
	rm -rf $(TIMINGS)
	+$(STAGE) setup $(MAKE) --no-print-directory -j 2 $(MATHJAX)/tex-mml-chtml.js $(CHROMIUM)
	rm -rf _build
	$(FORKED_KERNELS) $(MAKE) --no-print-directory -j 3 test-notebooks test-unit test-site test-browser
	@$(PYTHON) .ci/timings.py --dir $(TIMINGS) --stages-only

.PHONY: test-notebooks test-unit test-site test-browser
test-notebooks:
	$(call book_config,cache,_build/config/execute.yml)
	$(STAGE) execute $(BIN)/python .ci/execute_cache.py --config _build/config/execute.yml --build-dir _build \
		--jobs $(JOBS) --timings $(TIMINGS)/notebooks.json --student-checks $(NOTEBOOKS)
	+$(STAGE) check-outputs $(MAKE) --no-print-directory check-outputs
test-unit:
	+BOOK_STUDENT_CHECKS=execute $(STAGE) --output $(TIMINGS)/unit.log unit $(MAKE) --no-print-directory unit
test-site:
	+$(STAGE) --output $(TIMINGS)/book.log book $(MAKE) --no-print-directory book
	+$(STAGE) links $(MAKE) --no-print-directory links
test-browser: test-site test-notebooks
	+$(STAGE) browser $(MAKE) --no-print-directory browser

slowest:
	@$(PYTHON) .ci/timings.py --dir $(TIMINGS)

# After `make book EXECUTE=1`: the executed build's checked cells against the stored outputs.
check-outputs: $(STAMP)
	$(BIN)/python .ci/check_outputs.py --config _build/config/execute.yml --build-dir _build \
		--sanitize tests/nbval_sanitize.cfg $(NOTEBOOKS)

# The browser suite's own tests (tests/book/browser) run in `make browser`, which make test runs too.
unit: $(STAMP)
	$(BIN)/python -m pytest tests -n $(JOBS) -q --ignore=tests/book/browser --junitxml=$(TIMINGS)/unit.xml

NBVAL := $(BIN)/python -m pytest --nbval-lax --nbval-cell-timeout=600 \
	--nbval-sanitize-with tests/nbval_sanitize.cfg -n $(JOBS) --dist loadscope -q -p no:cacheprovider

nbval: $(STAMP)
	$(NBVAL) $(NOTEBOOKS)

# The same nbval, with the outputs computed another way than on the machine that stored them: torch's
# (ATen's) AVX2 kernels and OpenBLAS's (numpy's) Haswell kernels, where an AVX-512 CPU otherwise uses
# its AVX-512 ones, and THREADS threads per process. Last digits move, so a checked cell that prints
# them fails here before it fails on a reader's machine. Also try CPU_CAPABILITY=default THREADS=1
# (no vector kernels in ATen, SSE4.2 in OpenBLAS); NOTEBOOKS="..." narrows the run.
CPU_CAPABILITY ?= avx2
THREADS ?= 2
OPENBLAS_CORE := $(if $(filter default,$(CPU_CAPABILITY)),Nehalem,$(if $(filter avx512,$(CPU_CAPABILITY)),SkylakeX,Haswell))
nbval-portable: $(STAMP)
	ATEN_CPU_CAPABILITY=$(CPU_CAPABILITY) OPENBLAS_CORETYPE=$(OPENBLAS_CORE) OMP_NUM_THREADS=$(THREADS) \
		$(NBVAL) $(NOTEBOOKS)

# LAB_ARGS="--ip=0.0.0.0 --no-browser": reachable from outside a plain Docker container (README, "Setup").
LAB_ARGS ?=
lab: $(STAMP)
	env -u BOOK_BATCH_EXECUTION $(BIN)/jupyter lab $(LAB_ARGS)

# JOBS notebooks at a time, every cell (the live widgets too), with nbclient's Output-widget mimic
# off: see .ci/execute_notebook.py.
execute: $(STAMP)
	printf '%s\n' $(NOTEBOOKS) | xargs -P $(JOBS) -I{} $(BIN)/python .ci/execute_notebook.py \
		--timeout $(CELL_TIMEOUT) {}

# A reader without Triton (macOS, Windows: no wheels): every notebook, JOBS at a time, with `import triton`
# failing in its kernel; each must run to the end (Triton cells say why and show the recorded figures).
notebooks-without-triton: $(STAMP)
	printf '%s\n' $(NOTEBOOKS) | xargs -P $(JOBS) -I{} $(BIN)/python .ci/run_without_triton.py \
		--timeout $(CELL_TIMEOUT) {}

# Repeat the executed build from a clean _build and report stalls (.ci/repeat_book.py).
book-repeat: $(STAMP)
	$(BIN)/python .ci/repeat_book.py --runs $(RUNS)

# Offline check of the built HTML: every internal link and anchor resolves, no asset from another host.
links: $(STAMP)
	$(BIN)/python -m tests.book.site_links _build/html

# The browser suite over the built book (make book first): Debian's Chromium, driven by Playwright,
# with every request to another host aborted. Installs chromium with apt-get when it is missing.
CHROMIUM ?= /usr/bin/chromium
$(CHROMIUM):
	$(if $(filter 0,$(shell id -u)),,sudo) apt-get update -qq
	$(if $(filter 0,$(shell id -u)),,sudo) apt-get install -y -qq chromium

browser: $(STAMP) $(CHROMIUM)
	BOOK_HTML=_build/html CHROMIUM=$(CHROMIUM) $(BIN)/python -m pytest tests/book -q -p no:cacheprovider \
		-n $(JOBS) --junitxml=$(TIMINGS)/browser.xml

# The labs without their solution cells (tagged `solution`), outputs cleared, same tree: a reader's
# "Run All" then stops at the first check, with a hint, instead of overwriting their work.
.PHONY: student
student: $(STAMP)
	rm -rf _build/student
	$(BIN)/python -m utils.student_edition --out _build/student
	@echo "Open _build/student/labs in JupyterLab: make lab, or $(BIN)/jupyter lab _build/student/labs"
	@echo "Warning: every 'make student' and every 'make test' deletes _build/student (rm -rf) and writes it afresh."
	@echo "Copy the labs to a folder of your own before you work in them, e.g. cp -r _build/student/labs my-labs"
	@echo "(no make target touches my-labs, and the labs' links to ../../chapters still work from there)."
	@echo "JupyterLab draws the exercise boxes only with the jupyterlab-myst extension, which the book does not install."

clean:
	rm -rf _build $(MATHJAX) .cache
