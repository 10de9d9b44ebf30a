# topicbus — the two commands an operator needs: `make run` and `make test`.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test bench soak chaos clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	PTB_TIMEDELTA=true $(BIN)/topicbus leader

# Three workers (pytest-xdist): the suite mostly waits on real processes, sockets and timers, so three
# share two cores well; worksteal keeps the long end-to-end tests from piling up on one worker.
test: $(STAMP)
	PTB_TIMEDELTA=true $(BIN)/python -m pytest -q -n 3 --dist worksteal

bench: $(STAMP)
	PTB_TIMEDELTA=true $(BIN)/python -m bench

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache

# The soak/load test (tests/soak, docs/reliability.md): 25 followers, random SIGKILLs, about 2 minutes.
soak: $(STAMP)
	TOPICBUS_SOAK=1 PTB_TIMEDELTA=true $(BIN)/python -m pytest -q tests/soak -p no:cacheprovider

# The adversarial runs (tests/chaos, docs/reliability.md): a slow reader, 1,100 idle connections under
# ulimit -n 1024, a failed delete and restarts, a child that never reads; a stranger's press storm,
# hostile file names and short downloads, eight 19 MB downloads, a 20 MB line through follow, topics
# written in before they are bound, voice notes to a failing endpoint (about 8 minutes in all).
chaos: $(STAMP)
	TOPICBUS_CHAOS=1 PTB_TIMEDELTA=true $(BIN)/python -m pytest -q tests/chaos -p no:cacheprovider
