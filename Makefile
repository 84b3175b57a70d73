# The README's two commands: `make bench` (the main job) and `make test` (every test).
# Each sets up a fresh machine by itself: Debian packages, .venv, Python deps, the Rust build.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMPS := .stamps
# slurmctld, slurmd, slurm-client and openssh-server are for the tests that run SLURM and ssh across
# the emulated cluster's hosts (tests/netem); the tests start their own daemons from scratch configs.
# On a machine with systemd, Debian starts sshd (port 22) and tries the SLURM services on install.
DEB_PACKAGES := openmpi-bin libopenmpi-dev iproute2 slurmctld slurmd slurm-client openssh-server
BENCH_ARGS ?=

.PHONY: bench test setup native plugin clean

# The main job answers "how fast is each backend here?": every backend this machine has (gloo,
# wirespeed, mpi; nccl on GPUs) side by side, each in its own processes, with the summary of who
# wins where and the plots. `wirespeed bench --backend X` measures one.
bench: setup
	$(VENV)/bin/wirespeed compare --nprocs 2 --dtypes float32 $(BENCH_ARGS)

test: setup
	cargo test --workspace --quiet
	$(PY) -m pytest -q --durations=30 tests

setup: $(STAMPS)/deps native plugin

# Debian packages: only what is missing, so a set-up machine is not touched (needs root or sudo).
$(STAMPS)/debs: Makefile
	@mkdir -p $(STAMPS)
	@missing=""; for p in $(DEB_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi
	@touch $@

$(PY):
	python3 -m venv $(VENV)

$(STAMPS)/deps: requirements.txt $(STAMPS)/debs | $(PY)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	@touch $@

# maturin builds the Rust core into wirespeed._native and installs the package editable into .venv.
native: $(STAMPS)/deps
	@command -v cargo >/dev/null || { echo "cargo not found: install Rust (rustup) first"; exit 1; }
	VIRTUAL_ENV=$(abspath $(VENV)) $(VENV)/bin/maturin develop --release -q

# The NCCL network plugin (crates/wirespeed-nccl), installed under the name NCCL_NET_PLUGIN=wirespeed
# looks for, with a libnccl-net.so link (the name NCCL opens when NCCL_NET_PLUGIN is unset) and
# the driver that tests and benchmarks it. `wirespeed plugin-path` prints where it is.
PLUGIN_DIR := target/nccl-plugin
plugin:
	@command -v cargo >/dev/null || { echo "cargo not found: install Rust (rustup) first"; exit 1; }
	cargo build --release -q -p wirespeed-nccl
	@mkdir -p $(PLUGIN_DIR)
	install -m 0755 target/release/libnccl_net_wirespeed.so $(PLUGIN_DIR)/libnccl-net-wirespeed.so
	ln -sf libnccl-net-wirespeed.so $(PLUGIN_DIR)/libnccl-net.so
	install -m 0755 target/release/wirespeed-nccl-driver $(PLUGIN_DIR)/wirespeed-nccl-driver

clean:
	rm -rf $(STAMPS) target runs
