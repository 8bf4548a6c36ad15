# The README's commands. Each installs what is missing first.
PYTHON ?= python3
BUILD ?= build
NPROCS ?= 4

.PHONY: all deps install test test-cpp test-py demo bench clean

all: install

deps:
	PYTHON=$(PYTHON) ./tools/install_deps.sh

# The package (extension, libconcord.so, header, concord.pc) into the
# current Python environment, rebuilt incrementally in $(BUILD)/py.
install: deps
	$(PYTHON) -m pip install -q --no-build-isolation -Cbuild-dir=$(BUILD)/py .

$(BUILD)/cpp/build.ninja:
	$(PYTHON) -m mesonbuild.mesonmain setup $(BUILD)/cpp -Dtests=true -Dbuildtype=debugoptimized

test-cpp: deps $(BUILD)/cpp/build.ninja
	$(PYTHON) -m mesonbuild.mesonmain test -C $(BUILD)/cpp --print-errorlogs

test-py: install
	$(PYTHON) -m pytest tests_py -q

test: test-cpp test-py

demo: install
	$(PYTHON) -m concord.run -n $(NPROCS) examples/train_mlp.py

bench: install
	$(PYTHON) bench/allreduce_cpu.py
	$(PYTHON) bench/grad_sync.py
	$(PYTHON) bench/optim.py
	$(PYTHON) bench/metrics_sync.py
	$(PYTHON) bench/gpu.py
	$(PYTHON) bench/jax_jit.py

clean:
	rm -rf $(BUILD)
