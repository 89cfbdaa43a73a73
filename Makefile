# polyarch developer targets. `make test` is the README's test command and
# is what .ci/run executes; `make demo` is its first look.
#   make demo       build polyarch, push examples/hello for two platforms, print the record
#   make test       install and start every engine the suite uses, build the book, check the
#                   fuzz targets compile, run every test
#   make lint       clippy, rustfmt, the fuzz targets compile
#   make docs       build the book (docs/) into docs/book/ with mdBook (scripts/crate-tool.sh)
#   make docs-gen   rewrite the book's generated reference pages (docs/src/reference/) from the
#                   clap definition and schema/*.json; tests/docs.rs fails until they match
#   make install, make dist, make bench: below
SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:$(PATH)

CARGO ?= cargo
TEST_THREADS ?= 2
# extra libtest arguments, e.g. TEST_ARGS="--skip some::test"
TEST_ARGS ?=
# Random cases of the differential test on Podman (the other engines run its default 24).
PODMAN_DIFF_CASES ?= 3
# The integration tests that never reach DOCKER_HOST's engine (they pass with it pointing
# nowhere): registries, files, the book, cargo, or an engine they pick themselves. They
# run in the first pass only.
ENGINE_FREE_TESTS := bake_print deep_limits docs gate_checks hostile_registry init install \
  layering support_smoke
# Every other integration test, run again on Docker 26.1 (a new tests/*.rs is among them
# until it is listed above).
ENGINE_26_TESTS := $(foreach t,$(filter-out $(ENGINE_FREE_TESTS),$(basename $(notdir \
  $(wildcard tests/*.rs)))),--test $(t))
# The integration tests whose outcome depends most on the engine (build, export,
# emulation, sessions), run a third time on Docker 28.5.
ENGINE_TESTS ?= --test binfmt --test build --test builders --test dependencies \
  --test differential --test export --test interrupt --test registry --test reproducible \
  --test platform_tests --test runners --test sbom --test session --test sign --test token_auth \
  --test named_contexts

.PHONY: all build demo test test-build lint fuzz-check fmt bench env fixtures docs docs-gen

all: build

# The release build with scripts/release-env.sh's flags: the one `make install`, `make
# dist` and the tests of both share.
build:
	CARGO="$(CARGO)" bash -c 'source scripts/release-env.sh && release_build'

env:
	bash scripts/ensure-env.sh test

fixtures:
	bash fixtures/fetch-busybox.sh

demo: build
	bash scripts/demo.sh

# The book. scripts/crate-tool.sh builds the pinned mdBook from crates.io the first time
# (ensure-env.sh test does it for `make test`).
docs:
	bash scripts/crate-tool.sh mdbook run build docs

docs-gen:
	POLYARCH_DOCS_REFRESH=1 $(CARGO) test --test docs reference_pages

# The book is built first, so a page mdBook cannot render fails the run; tests/docs.rs
# (in the first pass) holds its links, examples and generated pages to the CLI.
# Every test on the machine's engine (Docker 20.10, classic store), then the integration
# tests but ENGINE_FREE_TESTS again on Docker 26.1 with the containerd image store
# (scripts/engine26.sh). The
# `netns_` tests bring their own Docker 26.1 on a test host (tests/remote_builders.rs)
# and run once. Then the integration tests whose outcome depends on the engine
# (ENGINE_TESTS) on Docker 28.5 with the containerd store (scripts/engine28.sh), and the
# `podman_` tests (tests/podman.rs) once, on Podman 4.3's API (scripts/podman.sh), then the
# differential test there with PODMAN_DIFF_CASES cases and no buildx comparison (Podman has
# no BuildKit for buildx to build on).
# The `buildkitd_` tests (tests/buildkitd*.rs) build on daemons (some beside the
# machine's engine), and the `buildx_reference_` tests (tests/buildx_reference.rs) pick
# Docker 28.5 and its buildx themselves, so they run in the first pass only.
# On a fresh machine the set-up's own builds (BuildKit, mdBook, cargo-auditable), the fuzz
# check and the compiles the tests need (the test binaries, the release build that
# tests/install.rs and tests/action.rs run) take most of the time: they run side by side,
# so the two cores stay busy through the set-up's downloads; the tests start once all are
# done, on a quiet machine.
test:
	@date +'==== %T set-up and compiles'
	$(MAKE) --no-print-directory -j5 --output-sync=line env fuzz-check test-build build
	$(MAKE) --no-print-directory docs
	@date +'==== %T pass 1: every test, Docker 20.10'
	$(CARGO) test --all-targets --no-fail-fast -- --test-threads=$(TEST_THREADS) --skip podman_ $(TEST_ARGS)
	@date +'==== %T pass 2: Docker 26.1 (containerd store)'
	DOCKER_HOST=$$(bash scripts/engine26.sh host containerd) \
	  $(CARGO) test $(ENGINE_26_TESTS) --no-fail-fast -- --test-threads=$(TEST_THREADS) --skip netns_ --skip podman_ --skip buildkitd_ --skip buildx_reference_ $(TEST_ARGS)
	@date +'==== %T pass 3: Docker 28.5 (containerd store)'
	DOCKER_HOST=$$(bash scripts/engine28.sh host containerd) \
	  $(CARGO) test $(ENGINE_TESTS) --no-fail-fast -- --test-threads=$(TEST_THREADS) --skip netns_ --skip podman_ $(TEST_ARGS)
	@date +'==== %T podman pass'
	DOCKER_HOST=$$(bash scripts/podman.sh host) \
	  $(CARGO) test --test podman --no-fail-fast -- --test-threads=$(TEST_THREADS) $(TEST_ARGS)
	DOCKER_HOST=$$(bash scripts/podman.sh host) POLYARCH_DIFF_CASES=$(PODMAN_DIFF_CASES) \
	  POLYARCH_DIFF_COMPARE_EVERY=0 \
	  $(CARGO) test --test differential --no-fail-fast -- --exact differential $(TEST_ARGS)

# The fuzz targets (fuzz/, nightly only to run) are checked to compile on stable, by `make
# test` too: they call the library by path and went stale unnoticed twice. They are a member
# of the workspace, so the check reuses the test build's build scripts and proc macros.
lint: fuzz-check
	$(CARGO) clippy --all-targets -- -D warnings
	$(CARGO) fmt --check

fuzz-check:
	$(CARGO) check -p polyarch-fuzz --locked --bins --no-default-features

test-build:
	$(CARGO) test --all-targets --no-run

fmt:
	$(CARGO) fmt

bench:
	@if [ -x bench/run.sh ] || [ -f bench/run.sh ]; then bash bench/run.sh; else echo "no bench/run.sh"; fi

# Install: release binary, man page and shell completions under $(DESTDIR)$(PREFIX);
# DOCKER_PLUGIN=user|system also installs it as the Docker CLI plugin (scripts/install.sh).
PREFIX ?= /usr/local
DESTDIR ?=
DOCKER_PLUGIN ?=
# Where `make dist` writes the release archive (scripts/dist.sh).
DIST_DIR ?= $(CURDIR)/dist

.PHONY: install dist
install:
	PREFIX="$(PREFIX)" DESTDIR="$(DESTDIR)" DOCKER_PLUGIN="$(DOCKER_PLUGIN)" CARGO="$(CARGO)" bash scripts/install.sh

dist:
	DIST_DIR="$(DIST_DIR)" CARGO="$(CARGO)" bash scripts/dist.sh
