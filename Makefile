# topicbus — the two commands an operator needs: `make run` and `make test`.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
RUN_STAMP  := $(VENV)/.installed-run
TEST_STAMP := $(VENV)/.installed-test
# The checkout is installed in setuptools' strict editable mode: a link tree under build/ laid out as
# the import package (topicbus/ holds links to app/'s files, topicbus/handlers/ to handlers/'s, …)
# and a .pth that names it. Python, mypy and an IDE then all see one plain package tree, with no
# import hook. A link is made per file, so the install is redone when a file is added or removed
# ($(SOURCES) lists them). setuptools announces each editable install with a multi-line "Editable
# installation." notice (an InformationOnly warning that pip shows): nothing to act on.
SOURCES := $(VENV)/.sources
PIP_INSTALL := PYTHONWARNINGS="ignore:Editable installation" $(BIN)/python -m pip install --quiet
EDITABLE := --config-settings editable_mode=strict

.PHONY: run test bench soak chaos clean FORCE

$(BIN)/python:
	$(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(PIP_INSTALL) --upgrade pip

# Rewritten only when the package's files differ from the last install's.
$(SOURCES): FORCE | $(BIN)/python
	@find app handlers storage migrations -name __pycache__ -prune -o -type f -print | LC_ALL=C sort > $@.new
	@if cmp -s $@.new $@; then rm $@.new; else mv $@.new $@; fi

# `make run` installs what the leader needs; `make test` (and bench, soak, chaos) adds the test extras.
$(RUN_STAMP): $(BIN)/python pyproject.toml $(SOURCES)
	$(PIP_INSTALL) -e . $(EDITABLE)
	touch $(RUN_STAMP)

$(TEST_STAMP): $(BIN)/python pyproject.toml $(SOURCES)
	$(PIP_INSTALL) -e '.[test]' $(EDITABLE)
	touch $(TEST_STAMP) $(RUN_STAMP)

run: $(RUN_STAMP)
	$(BIN)/topicbus leader

# Three workers (pytest-xdist): the suite mostly waits on real processes, sockets and timers, so three
# share two cores well; worksteal keeps the long end-to-end tests from piling up on one worker.
# Programs the end-to-end tests run under `follow` (Debian's packages; installed when missing, as root).
TEST_PROGRAMS := bash sqlite3 git less
test: $(TEST_STAMP)
	@missing=; for p in $(TEST_PROGRAMS); do command -v $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	[ -z "$$missing" ] || { echo "installing$$missing for the end-to-end tests"; apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; }
	$(BIN)/python -m mypy
	$(BIN)/python -m pytest -q -n 3 --dist worksteal

bench: $(TEST_STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache

# The soak/load test (tests/soak, docs/reliability.md): 25 followers, random SIGKILLs, about 2 minutes.
soak: $(TEST_STAMP)
	TOPICBUS_SOAK=1 $(BIN)/python -m pytest -q tests/soak -p no:cacheprovider

# The adversarial runs (tests/chaos, docs/reliability.md): a slow reader, 1,100 idle connections under
# ulimit -n 1024, a failed delete and restarts, a child that never reads; a stranger's press storm,
# hostile file names and short downloads, eight 19 MB downloads, a 20 MB line through follow, topics
# written in before they are bound, voice notes to a failing endpoint (about 8 minutes in all).
chaos: $(TEST_STAMP)
	TOPICBUS_CHAOS=1 $(BIN)/python -m pytest -q tests/chaos -p no:cacheprovider
