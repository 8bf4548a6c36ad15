# The README's commands. Each installs what is missing first.
PYTHON ?= python3
BUILD ?= build
NPROCS ?= 4
# rustup installs cargo in ~/.cargo/bin, which not every shell has on PATH.
CARGO ?= $(shell command -v cargo || echo $(HOME)/.cargo/bin/cargo)

.PHONY: all deps install test test-cpp test-py test-rust demo bench clean

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

# The Rust crates (rust/) against the installed library, their multi-rank
# tests as concord-run jobs of $(PYTHON)'s concord; offline: they use no
# crate from a registry.
test-rust: install
	@if [ -x "$(CARGO)" ]; then \
	  cd rust && PYTHON=$(PYTHON) CARGO_TARGET_DIR=$(abspath $(BUILD))/cargo $(CARGO) test --offline; \
	else \
	  echo "make test-rust: cargo not found (install a Rust toolchain, 1.77 or later): the Rust crates were not tested"; \
	fi

test: test-cpp test-py test-rust

demo: install
	$(PYTHON) -m concord.run -n $(NPROCS) examples/train_mlp.py

bench: install
	$(PYTHON) bench/allreduce_cpu.py
	$(PYTHON) bench/grad_sync.py
	$(PYTHON) bench/optim.py
	$(PYTHON) bench/metrics_sync.py
	$(PYTHON) bench/gpu.py
	$(PYTHON) bench/jax_jit.py
	$(PYTHON) bench/ddp.py
	$(PYTHON) bench/multihost.py
	$(PYTHON) bench/store_load.py

clean:
	rm -rf $(BUILD)
