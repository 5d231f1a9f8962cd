# The two commands of the README, plus the pieces they are made of. Run as root on Debian 12.
VENV ?= /opt/tether/venv
PYTEST_ARGS ?=
PYTEST = $(VENV)/bin/python -m pytest -p no:cacheprovider

.PHONY: install deb test-setup demo test test-unit test-cluster bench sandbox-up sandbox-down generated

# The product only (the venv, tether, its link); the sandbox and the tests need test-setup.
install:
	tools/install

# tether's wheel and its Debian package for this host's Slurm (tether-slurm<major>_<version>_<arch>.deb)
# into dist/, with Debian's tools (tools/deb.py; it names the Debian packages the build needs).
# DEB_PYTHON builds the wheel (its pip); the plugins are built with Debian's /usr/bin/python3.
# SLURM_RELEASE=24.11 (or 26.05): for that Slurm release, built in its Debian root (the sandbox's).
DEB_PYTHON ?= $(if $(wildcard $(VENV)/bin/python),$(VENV)/bin/python,python3)
SLURM_RELEASE ?=
deb:
	$(DEB_PYTHON) tools/deb.py --out dist --wheel-python $(DEB_PYTHON) $(if $(SLURM_RELEASE),--slurm-release $(SLURM_RELEASE))

# install, plus the test extras and the sandbox cluster's packages and job user
test-setup:
	tests/bootstrap

# Bring up the local 3-node Slurm cluster and run the main multi-node job on it.
demo: test-setup
	$(VENV)/bin/tether demo

# The whole test suite: tests/unit (no daemons, seconds) and tests/cluster (the real sandbox, the
# host's Slurm 22.05), then the whole cluster level again on Slurm 24.11 and the run side on 26.05
# (a sandbox in a Debian root each; tests/cluster/test_slurm_releases.py runs on both in the first
# pass). TETHER_TEST_SLURM points the tests' cluster at a release.
test: test-setup
	$(PYTEST) $(PYTEST_ARGS)
	TETHER_TEST_SLURM=24.11 $(PYTEST) tests/cluster $(PYTEST_ARGS)
	TETHER_TEST_SLURM=26.05 $(PYTEST) tests/cluster/test_run_side.py $(PYTEST_ARGS)

# the unit level on every CPU (pytest-xdist: its tests share nothing but their own tmp paths)
test-unit: test-setup
	$(PYTEST) -n auto tests/unit $(PYTEST_ARGS)

test-cluster: test-setup
	$(PYTEST) tests/cluster $(PYTEST_ARGS)

# Every benchmark, then the README's performance table rewritten from what they recorded.
BENCH_SUMMARY := /var/tmp/tether-bench-summary.jsonl
bench: test-setup
	rm -f $(BENCH_SUMMARY)
	TETHER_BENCH_SUMMARY=$(BENCH_SUMMARY) $(VENV)/bin/python bench/plan.py
	TETHER_BENCH_SUMMARY=$(BENCH_SUMMARY) $(VENV)/bin/python bench/submit.py
	TETHER_BENCH_SUMMARY=$(BENCH_SUMMARY) $(VENV)/bin/python bench/handler.py
	TETHER_BENCH_SUMMARY=$(BENCH_SUMMARY) $(VENV)/bin/python bench/step.py
	TETHER_BENCH_SUMMARY=$(BENCH_SUMMARY) $(VENV)/bin/python bench/launch.py
	TETHER_BENCH_SUMMARY=$(BENCH_SUMMARY) $(VENV)/bin/python bench/floor.py
	TETHER_BENCH_SUMMARY=$(BENCH_SUMMARY) $(VENV)/bin/python bench/store.py
	$(VENV)/bin/python bench/tight.py
	$(VENV)/bin/python bench/launcher.py
	$(VENV)/bin/python bench/workflow.py
	$(VENV)/bin/python bench/report.py $(BENCH_SUMMARY) README.md

sandbox-up: test-setup
	$(VENV)/bin/tether sandbox up

sandbox-down:
	$(VENV)/bin/tether sandbox down

# Files generated from the names table (hooks/surface.py) and committed -- native/tether_names.h, the
# README's tables, docs/man; a test keeps them equal.
generated: install
	$(VENV)/bin/python tools/regenerate.py
