# Ferry's build, test and lint entry points. `make help` lists them.

GO      ?= go
BIN     ?= bin/ferry
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.buildVersion=$(VERSION)
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: help build test test-short test-versions bench bench-against bench-dedicated bench-mirror bench-switchover bench-scale bench-clients bench-distance bench-fleet bench-tls chaos lint demo

help:
	@echo "make build       build $(BIN)"
	@echo "make demo        run Ferry in front of two in-process Kafka clusters"
	@echo "make test        the full suite: installs the client matrix's tools, real Kafka (Java), ~40 min max"
	@echo "make test-short  unit and in-process tests only (no JVM)"
	@echo "make test-versions the whole Kafka version matrix (2.8 ZooKeeper, 3.6 and 3.9 KRaft and ZooKeeper, 4.4): Ferry in front of each, each older one migrated to 4.4 and back (make test runs a slice)"
	@echo "make bench       Ferry vs a direct connection and a bare splice relay on a real 3-broker cluster, then bench-mirror"
	@echo "make bench-dedicated the same with Ferry on CPU 1 and everything else on CPU 0 (taskset)"
	@echo "make bench-against BASE=<commit> the same, with BASE's build of Ferry run beside this tree's, alternating (CPU per GiB of both): a change shown not to cost"
	@echo "make bench-mirror Ferry's mirror vs MirrorMaker 2 and the target's produce ceiling (MIRRORBENCHFLAGS)"
	@echo "make bench-switchover planned and forced switchovers under traffic on real Kafka, consume before/after (SWITCHBENCHFLAGS); then automatic failover, the active cluster's broker killed (AUTOBENCHFLAGS)"
	@echo "make bench-distance the mirror's copy and the planned switch with the standby 20, 50 and 100 ms away (a delaying relay): mirrorbench -rtts, switchbench -rtt (DISTANCEBENCHFLAGS, SWITCHRTT)"
	@echo "make bench-scale the switchover, Metadata, memory, idle CPU and the mirror's catch-up as the clusters grow to 10,000 partitions and 1,000 groups, 10,000 idle client connections (SCALEBENCHFLAGS); the member alone up to 100,000 partitions in front of in-process kfake clusters (SCALEFAKEBENCHFLAGS); then bench-clients"
	@echo "make bench-clients produce and consume with 1,000 active clients at once against 10: MB/s, Ferry's CPU per GiB and RSS (CLIENTSBENCHFLAGS)"
	@echo "make bench-fleet three members on real Kafka: kill -9 under producers, mirror MB/s with one member vs three, a new generation across the fleet (FLEETBENCHFLAGS)"
	@echo "make bench-tls   TLS to clients, to brokers, both and neither, through Ferry and directly, on real Kafka (TLSBENCHFLAGS)"
	@echo "make chaos       the randomized fault schedule against a fleet on real Kafka, forced switches included, CHAOS_DURATION (30m), CHAOS_SEED (0: from the clock), CHAOS_FORCED (true); writes docs/CHAOS.md"
	@echo "make lint        go vet, gofmt, staticcheck"

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/ferry

demo:
	$(GO) run ./cmd/ferry demo

# Packages tested under the race detector in `make test`: every package
# whose tests run Ferry's code in their own process (kfake and real Kafka),
# mirror and cmd/ferry included. Left without it: the client matrix
# (conformance: Java, librdkafka and kafkajs driving Ferry) and deploy
# (the container image and Kubernetes files), where the time goes to other
# processes. Alone on 2 cores, -race took mirror 274 s (220 s without) and
# cmd/ferry 528 s.
RACE_PKGS := ./routing ./admin ./protocol ./protocol/clusterauth ./membership ./fleetswitch ./clientauth ./connstats ./upstream ./internal/listen ./internal/logsample ./internal/promreg ./internal/splice ./internal/testwait ./protocol/kfields ./protocol/errorresp ./proxy ./mirror ./cmd/ferry ./failover \
	./conformance/gateway ./conformance/kafkatest ./conformance/testpki ./conformance/benchutil ./conformance/tlsbench

# The full suite, as .ci/run runs it. conformance/clients/install.sh installs
# what the client matrix needs (Debian packages, a PyPI venv, npm modules);
# the Kafka jars are resolved by the harness through Maven into .cache/.
test:
	@if [ -x conformance/clients/install.sh ]; then conformance/clients/install.sh; \
	elif [ -f conformance/clients/install.sh ]; then bash conformance/clients/install.sh; fi
	$(GO) test -race -count=1 -timeout 40m $(RACE_PKGS)
	$(GO) test -count=1 -timeout 40m $$($(GO) list ./... | grep -vxF $(foreach p,$(RACE_PKGS),-e github.com/ferry-gw/ferry/$(p:./%=%)))

test-short:
	$(GO) test -short ./...

# The whole version matrix (kafkatest.Matrix; docs/COMPATIBILITY.md): the
# harness starting each version, Ferry in front of each, and each older
# variant migrated to 4.4 and back, then retired. `make test` runs a slice
# of it (TestVersions/2.8.2-zk, TestVersionsFront/3.9.1-kraft,
# TestVersionsMigration/3.9.1-zk).
test-versions:
	FERRY_VERSIONS=all $(GO) test -count=1 -timeout 60m -run '^TestVersions' -v ./conformance/kafkatest ./cmd/ferry

bench:
	$(GO) run ./conformance/bench $(BENCHFLAGS)
	$(GO) run ./conformance/mirrorbench $(MIRRORBENCHFLAGS)

# BASE's Ferry, built from its tree (git archive) in .cache, beside this
# tree's in the same run.
bench-against:
	@test -n "$(BASE)" || { echo 'usage: make bench-against BASE=<commit> [BENCHFLAGS=...]' >&2; exit 2; }
	rm -rf .cache/bench-base && mkdir -p .cache/bench-base
	git archive $(BASE) | tar -x -C .cache/bench-base
	cd .cache/bench-base && $(GO) build -o ../ferry-base ./cmd/ferry
	rm -rf .cache/bench-base
	$(GO) build -o .cache/ferry-new ./cmd/ferry
	$(GO) run ./conformance/bench -ferry-bin .cache/ferry-new -ferry-base-bin .cache/ferry-base $(BENCHFLAGS)

bench-dedicated:
	taskset -c 0 $(GO) run ./conformance/bench -ferry-cpus 1 $(BENCHFLAGS)

bench-mirror:
	$(GO) run ./conformance/mirrorbench $(MIRRORBENCHFLAGS)

AUTOBENCHFLAGS ?= -rounds 5 -failover-after 5s
bench-switchover:
	$(GO) run ./conformance/switchbench $(SWITCHBENCHFLAGS)
	$(GO) run ./conformance/switchbench -automatic $(AUTOBENCHFLAGS)

SCALEBENCHFLAGS ?= -shapes 100x10,1000x100,5000x500,10000x1000 -idle-conns 10000 -rounds 3 -consume-bytes 0 -out docs/SCALE-BENCHMARKS.md
# Past what this machine's brokers hold: the member in front of two
# in-process kfake clusters, its own costs per partition served up to
# 100,000 (the idle topics not mirrored: kfake's transaction coordinator
# visits every transactional ID on each request, and five per mirrored
# partition make it, not the member, what a run measures past 10,000).
SCALEFAKEBENCHFLAGS ?= -fake -mirror-exclude 'scale-.*' -shapes 10000x1000,50000x1000,100000x1000 -rounds 3 -consume-bytes 0 -catchup-bytes 0 -out docs/SCALE-KFAKE-BENCHMARKS.md
# Many active clients at once against few: produce and consume MB/s,
# Ferry's CPU per GiB and RSS (part of bench-scale).
CLIENTSBENCHFLAGS ?= -clients 10,1000 -relay=false -rounds 3 -duration 15s -warmup 5s -out docs/CLIENTS-BENCHMARKS.md
bench-scale:
	$(GO) run ./conformance/switchbench $(SCALEBENCHFLAGS)
	$(GO) run ./conformance/switchbench $(SCALEFAKEBENCHFLAGS)
	$(GO) run ./conformance/bench $(CLIENTSBENCHFLAGS)

bench-clients:
	$(GO) run ./conformance/bench $(CLIENTSBENCHFLAGS)

# The standby a round trip away: the mirror's copy (16 KiB batches, the Java
# producer's default) at each round-trip time against the same copy at 0 ms,
# then the planned and forced switch at 0 ms and at SWITCHRTT.
DISTANCEBENCHFLAGS ?= -bytes 256MiB -partitions 4 -codecs none -skip-mm2 -rtts 20ms,50ms,100ms -batch-bytes 16KiB
SWITCHRTT ?= 50ms
bench-distance:
	$(GO) run ./conformance/mirrorbench $(DISTANCEBENCHFLAGS)
	$(GO) run ./conformance/switchbench -rounds 3 -consume-bytes 0
	$(GO) run ./conformance/switchbench -rounds 3 -consume-bytes 0 -rtt $(SWITCHRTT)

bench-fleet:
	$(GO) run ./conformance/fleetbench $(FLEETBENCHFLAGS)

bench-tls:
	$(GO) run ./conformance/tlsbench $(TLSBENCHFLAGS)

# The fault schedule of TestChaos, long (the suite runs a short one,
# without forced switches: each one's repair of the old cluster takes a
# minute or two). A failing run prints its seed; CHAOS_SEED replays it.
CHAOS_DURATION ?= 30m
CHAOS_SEED     ?= 0
CHAOS_FORCED   ?= true
chaos:
	$(GO) test -count=1 -timeout 4h -run 'TestChaos$$' -v ./conformance \
		-args -chaos.duration=$(CHAOS_DURATION) -chaos.seed=$(CHAOS_SEED) -chaos.copy=true -chaos.forced=$(CHAOS_FORCED) -chaos.report=$(CURDIR)/docs/CHAOS.md

lint:
	$(GO) vet ./...
	@unformatted=$$(find . -name '*.go' -not -path './.cache/*' -not -path '*/node_modules/*' -not -path './.git/*' | xargs gofmt -l); \
	if [ -n "$$unformatted" ]; then echo "gofmt needed on:"; echo "$$unformatted"; exit 1; fi
	$(GO) run $(STATICCHECK) ./...
