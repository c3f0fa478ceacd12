# Drover build. `make run` starts the product on embedded defaults; `make test`
# runs every test (installing what it needs when run as root).
SHELL := /bin/bash
GO ?= go
BIN := bin
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X main.version=$(VERSION)
# Keep in step with packaging.BuildTags (packaging/build.go says why).
TAGS := grpcnotrace
FUZZTIME ?= 60s
TEST_FUZZTIME ?= 3s
BENCHTIME ?= 1x

.PHONY: all build test unit lint fmt vet staticcheck run proto fuzz bench bench-fleet deps packages clean

all: build

build:
	@mkdir -p $(BIN)
	CGO_ENABLED=0 $(GO) build -trimpath -tags $(TAGS) -ldflags '$(LDFLAGS)' -o $(BIN)/ ./cmd/...

deps:
	@scripts/deps.sh

# The full proof: lint, every package's tests (real systemd user managers,
# real TLS servers, real SQLite and bbolt files), then each fuzz target briefly.
# The ten-minute placement proof (agent/e2e) mostly waits for fire times:
# it runs beside the other packages instead of after agent/e2e's other
# tests, and its output follows theirs.
LONG_E2E = ^TestPlacementOneAcrossFaults$$
test: deps lint
	@long=$$(mktemp); \
	$(GO) test -count=1 -timeout 14m -run '$(LONG_E2E)' ./agent/e2e >$$long 2>&1 & pid=$$!; \
	$(GO) test -count=1 -timeout 14m -skip '$(LONG_E2E)' ./...; rc=$$?; \
	wait $$pid; lrc=$$?; echo "--- $(LONG_E2E) (agent/e2e):"; cat $$long; rm -f $$long; \
	[ $$rc -eq 0 ] && [ $$lrc -eq 0 ]
	@scripts/fuzz.sh $(TEST_FUZZTIME)

lint: fmt vet staticcheck

fmt:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go') | grep -v '\.pb\.go$$' || true); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

staticcheck:
	$(GO) tool staticcheck ./...

run: build
	@scripts/run.sh

packages:
	@scripts/packages.sh

proto:
	@scripts/protogen.sh

fuzz:
	@scripts/fuzz.sh $(FUZZTIME)

bench:
	$(GO) test -run='^$$' -bench=. -benchmem -benchtime=$(BENCHTIME) ./...

# A simulated fleet (drover-sim) against a fresh local drover-server: one
# line per step of BENCH_AGENTS. The full fleet line (needs the machine to
# itself; see the README's "Simulated fleet"):
#   make bench-fleet BENCH_AGENTS=1000,5000,10000,19500 \
#     BENCH_FLEET_FLAGS='--no-verify --run-every 5m --log-bytes 4096 --window 60s'
BENCH_AGENTS ?= 200
BENCH_FLEET_FLAGS ?= --warmup 15s --window 30s
bench-fleet: build
	AGENTS='$(BENCH_AGENTS)' SIM_FLAGS='$(BENCH_FLEET_FLAGS)' cmd/drover-sim/bench-fleet.sh

clean:
	rm -rf $(BIN) dist .run
