# topicbus — the two commands an operator needs: `make run` and `make test`.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
RUN_STAMP  := $(VENV)/.installed-run
TEST_STAMP := $(VENV)/.installed-test
# The editable install of our package-dir layout (topicbus -> app/, …) goes through setuptools' meta
# path finder, which announces itself with a multi-line "Editable installation." notice on every
# install (a setuptools InformationOnly warning that pip shows): informational only, nothing to act on.
PIP_INSTALL := PYTHONWARNINGS="ignore:Editable installation" $(BIN)/python -m pip install --quiet

.PHONY: run test bench soak chaos clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)

# `make run` installs what the leader needs; `make test` (and bench, soak, chaos) adds the test extras.
$(RUN_STAMP): $(BIN)/python pyproject.toml
	$(PIP_INSTALL) --upgrade pip
	$(PIP_INSTALL) -e .
	touch $(RUN_STAMP)

$(TEST_STAMP): $(BIN)/python pyproject.toml
	$(PIP_INSTALL) --upgrade pip
	$(PIP_INSTALL) -e '.[test]'
	touch $(TEST_STAMP) $(RUN_STAMP)

run: $(RUN_STAMP)
	PTB_TIMEDELTA=true $(BIN)/topicbus leader

# Three workers (pytest-xdist): the suite mostly waits on real processes, sockets and timers, so three
# share two cores well; worksteal keeps the long end-to-end tests from piling up on one worker.
# Programs the end-to-end tests run under `follow` (Debian's packages; installed when missing, as root).
TEST_PROGRAMS := bash sqlite3 git less
test: $(TEST_STAMP)
	@missing=; for p in $(TEST_PROGRAMS); do command -v $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	[ -z "$$missing" ] || { echo "installing$$missing for the end-to-end tests"; apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; }
	PTB_TIMEDELTA=true $(BIN)/python -m pytest -q -n 3 --dist worksteal

bench: $(TEST_STAMP)
	PTB_TIMEDELTA=true $(BIN)/python -m bench

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache

# The soak/load test (tests/soak, docs/reliability.md): 25 followers, random SIGKILLs, about 2 minutes.
soak: $(TEST_STAMP)
	TOPICBUS_SOAK=1 PTB_TIMEDELTA=true $(BIN)/python -m pytest -q tests/soak -p no:cacheprovider

# The adversarial runs (tests/chaos, docs/reliability.md): a slow reader, 1,100 idle connections under
# ulimit -n 1024, a failed delete and restarts, a child that never reads; a stranger's press storm,
# hostile file names and short downloads, eight 19 MB downloads, a 20 MB line through follow, topics
# written in before they are bound, voice notes to a failing endpoint (about 8 minutes in all).
chaos: $(TEST_STAMP)
	TOPICBUS_CHAOS=1 PTB_TIMEDELTA=true $(BIN)/python -m pytest -q tests/chaos -p no:cacheprovider
