# The two commands of the README, plus the pieces they are made of. Run as root on Debian 12.
VENV ?= /opt/tether/venv
PYTEST_ARGS ?=

.PHONY: install demo test bench sandbox-up sandbox-down

install:
	tests/bootstrap

# Bring up the local 3-node Slurm cluster and run the main multi-node job on it.
demo: install
	$(VENV)/bin/tether demo

# The whole test suite, real-cluster tests included.
test: install
	$(VENV)/bin/python -m pytest -p no:cacheprovider $(PYTEST_ARGS)

bench: install
	$(VENV)/bin/python bench/plan.py
	$(VENV)/bin/python bench/submit.py
	$(VENV)/bin/python bench/step.py
	$(VENV)/bin/python bench/launch.py

sandbox-up: install
	$(VENV)/bin/tether sandbox up

sandbox-down:
	$(VENV)/bin/tether sandbox down
