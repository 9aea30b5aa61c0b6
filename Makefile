# fed_ros: `make test` and `make demo` set everything up on a fresh machine:
# .venv with the pinned dependencies (ROS 2 Kilted wheels, torch CPU, robosuite/MuJoCo),
# the package's ROS 2 interfaces built with CMake into the venv, and fed_ros itself
# installed editable. Each step is stamped, so a re-run with nothing changed is quick.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
VENV_ABS := $(abspath $(VENV))
BUILD_DIR := build/venv-interfaces
PYTEST_ARGS ?=

export MUJOCO_GL ?= egl
export PYOPENGL_PLATFORM ?= egl

DEPS_STAMP := $(VENV)/.stamp-deps
MSGS_STAMP := $(VENV)/.stamp-msgs
PKG_STAMP := $(VENV)/.stamp-pkg
EXTRAS_STAMP := $(VENV)/.stamp-extras
INTERFACE_FILES := $(wildcard msg/*.msg srv/*.srv)

.PHONY: setup extras lint format test test-fast mutation demo clean colcon-check interop

# The tracking and dataset extras belong to the main path: the README's `tensorboard --logdir
# runs` after `make demo` and `fed-ros dataset export` need them (issue 36).
setup: $(MSGS_STAMP) $(EXTRAS_STAMP)

$(DEPS_STAMP): requirements.txt
	@# A venv cut short while being created (Ctrl-C) has python but no pip: make it again.
	@$(PY) -m pip --version >/dev/null 2>&1 || python3 -m venv --clear $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt
	@touch $@

# Interfaces, node executables (lib/fed_ros) and per-file links of launch/ and config/
# (share/fed_ros), with FED_ROS_INSTALL_PYTHON_SOURCES=OFF: the Python modules run from
# the source tree so edits need no rebuild. That makes the venv a prefix `ros2 launch
# fed_ros ...` and `ros2 run fed_ros ...` find (AMENT_PREFIX_PATH=.venv).
$(MSGS_STAMP): $(PKG_STAMP) CMakeLists.txt package.xml fed_ros/__init__.py cmake/strip_opt_python_includes.cmake $(INTERFACE_FILES) \
  cmake/link_share_files.cmake $(wildcard scripts/* launch/*.launch.py)
	rm -rf $(BUILD_DIR) && mkdir -p build
	AMENT_PREFIX_PATH=$(VENV_ABS) CMAKE_PREFIX_PATH=$(VENV_ABS) cmake -S . -B $(BUILD_DIR) \
	  -DCMAKE_INSTALL_PREFIX=$(VENV_ABS) -DPython3_EXECUTABLE=$(VENV_ABS)/bin/python \
	  -DCMAKE_PROJECT_INCLUDE=$(abspath cmake/strip_opt_python_includes.cmake) \
	  -DFED_ROS_INSTALL_PYTHON_SOURCES=OFF -DBUILD_TESTING=OFF > $(BUILD_DIR).log 2>&1 || (cat $(BUILD_DIR).log; exit 1)
	cmake --build $(BUILD_DIR) -j2 >> $(BUILD_DIR).log 2>&1 || (tail -50 $(BUILD_DIR).log; exit 1)
	cmake --install $(BUILD_DIR) >> $(BUILD_DIR).log 2>&1 || (tail -50 $(BUILD_DIR).log; exit 1)
	@touch $@

# The tracking and dataset extras (requirements-extras.txt: TensorBoard, pyarrow, pandas, Pillow,
# PyAV): installed by `make setup`, so the README's next steps work right after `make demo`.
$(EXTRAS_STAMP): $(DEPS_STAMP) requirements-extras.txt
	$(PY) -m pip install -q --disable-pip-version-check -r requirements-extras.txt
	@touch $@

# pip's editable install removes a site-packages/fed_ros it did not create, so it runs
# before the interface install (which re-runs after it).
$(PKG_STAMP): $(DEPS_STAMP) setup.py
	$(PY) -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	@touch $@

# Test oracle, not a dependency: the real ROS 2 launch system (launch, launch_ros, the `ros2`
# command) for test/slow/test_launch_real.py, installed from ../shared/tools/ros2-launch when that
# folder exists (a full ROS 2 install brings its own; without either those tests skip).
ROS2_LAUNCH_TOOL := $(abspath ../shared/tools/ros2-launch)
LAUNCH_STAMP := $(VENV)/.stamp-ros2-launch

$(LAUNCH_STAMP): $(DEPS_STAMP)
	@if [ -f $(ROS2_LAUNCH_TOOL)/install.sh ]; then bash $(ROS2_LAUNCH_TOOL)/install.sh $(VENV) && touch $@; \
	else echo "ros2-launch: $(ROS2_LAUNCH_TOOL) absent, the real-launch tests will skip"; fi

# Test order: file order by default; `make test ORDER=` shuffles (pytest-randomly prints the
# seed; `make test ORDER= PYTEST_ARGS=--randomly-seed=N` replays one).
ORDER ?= -p no:randomly
# Two workers (pytest-xdist), each running one test file at a time (module fixtures stay
# whole): most tests wait on DDS discovery, lockstep simulators and child processes, so one
# worker leaves a core idle half the time. One torch/OpenMP thread per process, so two
# workers' training does not spin four threads on two cores. TEST_JOBS=0: one process.
TEST_JOBS ?= 2
# Test-only integrations (requirements-test-extras.txt: MLflow, Ray): the fleet and the demo run
# without them; the tests of each need the real library, so `make test` installs them.
TEST_EXTRAS_STAMP := $(VENV)/.stamp-test-extras
$(TEST_EXTRAS_STAMP): $(EXTRAS_STAMP) requirements-test-extras.txt
	$(PY) -m pip install -q --disable-pip-version-check -r requirements-test-extras.txt
	@touch $@
extras: $(TEST_EXTRAS_STAMP)
# A real headless browser for the live fleet view's test (test_web_status_browser.py): Debian's
# chromium, installed when the machine lacks one and `make test` runs as root with apt; otherwise
# that one test skips, naming why (README, "Tests and what skips where").
BROWSER_STAMP := $(VENV)/.stamp-browser
$(BROWSER_STAMP): $(DEPS_STAMP)
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
	  && DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y -q --no-install-recommends chromium \
	  >$(VENV)/apt-chromium.log 2>&1; } || echo "chromium not installed: the browser test will skip (see $(VENV)/apt-chromium.log)"
	@touch $@

# Lint (pyproject.toml [tool.ruff]): the tree is `ruff format`ted (line length 100) and passes
# the pyflakes, syntax and line-length checks over the package, tests, tools and launch files;
# `make test` runs it first, so CI fails on an unformatted file, a line over 100 characters or an
# unused or undefined name. `make format` fixes the formatting.
RUFF_PATHS := fed_ros test tools launch
# mypy (pyproject.toml [tool.mypy]) over fed_ros: strict on core, standard on learning, basic
# elsewhere, with the errors found when it came in listed per module as debt (docs/contracts.md).
lint: setup
	$(VENV)/bin/ruff format --check --no-cache $(RUFF_PATHS)
	$(VENV)/bin/ruff check --no-cache $(RUFF_PATHS)
	$(VENV)/bin/mypy
	@$(PY) tools/module_sizes.py fed_ros

format: setup
	$(VENV)/bin/ruff format --no-cache $(RUFF_PATHS)

test: setup lint $(LAUNCH_STAMP) $(TEST_EXTRAS_STAMP) $(BROWSER_STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest test $(ORDER) -n $(TEST_JOBS) --dist loadfile --durations=30 $(PYTEST_ARGS)

# Fast feedback tier: pure modules only, no ROS processes, no MuJoCo, no torch training;
# random order every run; fuzzing at 1,000 messages per handler instead of 10,000.
# README "Fast tier" lists what it leaves out and why.
test-fast: setup
	FED_ROS_FUZZ_EXAMPLES=1000 $(PY) -m pytest test -m unit -p randomly $(PYTEST_ARGS)

# Mutation testing of the ROS-free decision code (mutmut, in a private copy under
# build/mutation; never rewrites the source tree): validation, signing, the round state
# machine, quorum, store, strategies, aggregation and clustering, i.e. every module
# run_mutation.py knows ('all'). MUTATION_MODULES=rounds,store picks a few; MUTATION_JOBS
# sets the parallel mutant workers.
MUTATION_MODULES ?= all
MUTATION_JOBS ?= 2
MUTATION_STAMP := $(VENV)/.stamp-mutation
$(MUTATION_STAMP): $(DEPS_STAMP) requirements-mutation.txt
	$(PY) -m pip install -q --disable-pip-version-check -r requirements-mutation.txt
	@touch $@
mutation: setup $(MUTATION_STAMP)
	nice -n 10 $(PY) test/mutation/run_mutation.py --modules $(MUTATION_MODULES) --jobs $(MUTATION_JOBS) --dir build/mutation

demo: setup
	$(VENV)/bin/fed-ros demo

# lerobot 0.4.4 itself against our LeRobot export and import, both directions
# (tools/lerobot_interop.py; docs/testing.md has a run). lerobot needs NumPy 2 and robosuite
# NumPy < 2, so it gets its own venv, Python 3.11, built once (stamped; about 5 min, ~6 GB with
# its CUDA torch). Not part of `make test`, which a test of the same files covers instead.
INTEROP_VENV := build/lerobot-venv
INTEROP_STAMP := $(INTEROP_VENV)/.stamp-interop
$(INTEROP_STAMP): requirements-interop.txt
	@$(INTEROP_VENV)/bin/python -m pip --version >/dev/null 2>&1 || python3.11 -m venv --clear $(INTEROP_VENV)
	$(INTEROP_VENV)/bin/python -m pip install -q --disable-pip-version-check -r requirements-interop.txt
	@touch $@
interop: setup $(INTEROP_STAMP)
	OMP_NUM_THREADS=1 $(INTEROP_VENV)/bin/python tools/lerobot_interop.py --fed-ros-venv $(VENV) --work build/interop

# CUDA machines only: CUDA tests + `fed-ros bench train --device cuda` with AMP (< ~5 min).
.PHONY: gpu-check
gpu-check: setup
	VENV=$(VENV) tools/gpu_check.sh

clean:
	rm -rf build install log .pytest_cache runs
