# gpu-dra — see README.md. Newcomers need two targets: `make demo` and `make test`.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -eu -o pipefail -c
export PATH := /usr/local/go/bin:$(PATH)
export GOFLAGS ?= -buildvcs=false

# The tested Kubernetes releases (K8S_RELEASE_*) and the project image (PROJECT_IMAGE_*) have one
# home.
include hack/buildenv/build.env
# A literal comma, for $(subst) of the comma-separated lists of build.env.
comma := ,
K8S_VERSION ?= $(K8S_RELEASE_SEED)
export K8S_VERSION
# The newest release, where the newer DRA features are served (sharing, partitions, device
# taints, resource health, extended resources): `make test` runs the suite there too, but for the
# chaos runs and the plugin restart, which `make e2e` covers on K8S_VERSION and which do not differ by release,
# and the upstream eviction-time demo, which waits out its 300 s toleration (`make e2e-matrix` runs it).
NEWEST_K8S_VERSION ?= $(K8S_RELEASE_NEWEST)
NEWEST_E2E_SKIP ?= Chaos|TestPluginRestart|TestDeviceTaintDemos/device-taint-configurable-pod-eviction-time
CACHE ?= $(or $(GPU_DRA_CACHE),$(HOME)/.cache/gpu-dra)
export GPU_DRA_CACHE := $(CACHE)
TOOLS := $(CACHE)/tools/bin
ENVTEST_ASSETS := $(CACHE)/envtest/v$(K8S_VERSION)
# The other releases whose API server integration tests run on (testapiserver.ReleaseAssetsDir, e.g.
# the plugin's claim status policy on 1.32.13, 1.34.2 and 1.37.2): only their kube-apiserver is built.
ENVTEST_RELEASES ?= $(K8S_RELEASE_OLDEST) $(NEWEST_K8S_VERSION)
# The newest release's binaries that integration tests run (hack/verify-test-binaries.sh keeps this
# list complete: a test asking for one not built here passes only where an e2e cluster built it).
NEWEST_TEST_BINARIES := kube-apiserver kube-controller-manager kube-scheduler
VERSION ?= $(PROJECT_IMAGE_TAG)
PROJECT_IMAGE ?= $(PROJECT_IMAGE_REPOSITORY):$(VERSION)
export PROJECT_IMAGE
BINARIES := gpu-kubelet-plugin gpu-webhook kubectl-dra
FUZZTIME ?= 10s
# Every package but the real-cluster suites: e2e/, the in-place upgrade scenario e2e/clusterupgrade/ and
# the multi-node suite e2e/multinode/.
UNIT_PKGS = $$(go list ./... | grep -v -e '/e2e$$' -e '/e2e/clusterupgrade$$' -e '/e2e/multinode$$')

.PHONY: all build deps unit integration fuzz bench scale lint test e2e e2e-newest e2e-matrix e2e-podgroups e2e-upgrade e2e-upgrade-newest e2e-multinode e2e-all demo \
	cluster-up cluster-down images envtest-assets envtest-releases clean help

all: build

help: ## list targets
	@grep -hE '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}' | \
	  sed -e 's/\$$(K8S_RELEASE_OLDEST)/$(K8S_RELEASE_OLDEST)/g' -e 's/\$$(K8S_RELEASE_UPGRADE_VIA)/$(K8S_RELEASE_UPGRADE_VIA)/g' \
	    -e 's/\$$(K8S_RELEASE_SEED)/$(K8S_RELEASE_SEED)/g' -e 's/\$$(K8S_RELEASE_NEWEST)/$(K8S_RELEASE_NEWEST)/g' \
	    -e 's/\$$(K8S_RELEASES_TO_NEWEST)/$(subst $(comma), -> ,$(K8S_RELEASES_TO_NEWEST))/g'

build: ## build the project's binaries into _output/bin
	@mkdir -p _output/bin
	@for b in $(BINARIES); do \
	  if [ -d cmd/$$b ]; then s=$$(date +%s); echo "    go build $$b ..."; \
	    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o _output/bin/$$b ./cmd/$$b; \
	    echo "    go build $$b done in $$(( $$(date +%s) - s ))s"; fi; \
	done

deps: ## install Debian packages and Go tools that tests and the demo need
	@hack/install-deps.sh

envtest-assets: ## a real kube-apiserver + etcd + kubectl for integration tests
	@e2e/cluster/envtest-assets.sh >/dev/null

envtest-releases: ## kube-apiserver + etcd of ENVTEST_RELEASES too, for tests that run on several releases (and the newest's kube-controller-manager and kube-scheduler, which some integration tests run)
	@for v in $(ENVTEST_RELEASES); do bins=kube-apiserver; \
	  if [ $$v = $(NEWEST_K8S_VERSION) ]; then bins="$(NEWEST_TEST_BINARIES)"; fi; \
	  K8S_VERSION=$$v K8S_BINARIES="$$bins" e2e/cluster/envtest-assets.sh >/dev/null; done

unit: ## unit tests (+ integration tests when `make envtest-assets` has run; they skip loudly otherwise)
	@if [ -x $(ENVTEST_ASSETS)/kube-apiserver ]; then export KUBEBUILDER_ASSETS=$(ENVTEST_ASSETS); fi; \
	go test -count=1 $(UNIT_PKGS)

integration: envtest-assets envtest-releases ## unit + integration tests against a real kube-apiserver (of several releases where a test asks)
	KUBEBUILDER_ASSETS=$(ENVTEST_ASSETS) go test -count=1 -timeout 30m $(UNIT_PKGS)

fuzz: ## run every fuzz target for FUZZTIME (seed corpora run in `unit` too)
	@hack/fuzz.sh $(FUZZTIME)

bench: deps envtest-assets ## the benchmarks of docs/performance.md, COUNT=5 runs each, through benchstat
	KUBEBUILDER_ASSETS=$(ENVTEST_ASSETS) BENCHSTAT=$(TOOLS)/benchstat VEGETA=$(TOOLS)/vegeta hack/bench.sh

scale: deps build ## the webhook and kubectl dra on 5,000 fake GPU nodes holding 40,000 claims, a control plane without kubelets (not in `test`; SCALE_NODES=1,100,... shrinks it)
	@hack/scale.sh

lint: ## gofmt, go vet, staticcheck, every target README.md or docs/ name that needs Debian packages runs `make deps`
	@out=$$(gofmt -l $$(git ls-files '*.go')); [ -z "$$out" ] || { echo "gofmt needed:"; echo "$$out"; exit 1; }
	go vet ./...
	@[ -x $(TOOLS)/staticcheck ] || hack/install-deps.sh
	$(TOOLS)/staticcheck ./...
	@for s in $$(git ls-files '*.sh'); do bash -n $$s; done
	@hack/verify-make-deps.sh
	@hack/verify-test-binaries.sh

images: build ## build image tarballs (no container engine needed)
	@e2e/cluster/images.sh build

cluster-up: deps ## start the local cluster (MODE=full|controlplane|multinode, NODES, K8S_VERSION, RUNTIME_CONFIG, FEATURE_GATES)
	@e2e/cluster/up.sh

cluster-down: ## stop the local cluster and clean up (MODE=multinode: the multi-node one; WIPE=1 deletes its state)
	@e2e/cluster/down.sh

e2e: deps images ## end-to-end suite: on $$KUBECONFIG's cluster if set, else on a local cluster it starts and stops
	@e2e/run.sh

e2e-newest: deps images ## the e2e suite on the newest release ($(K8S_RELEASE_NEWEST)), but the chaos runs, the plugin restart and a 5-minute eviction wait
	@K8S_VERSION=$(NEWEST_K8S_VERSION) E2E_SKIP='$(NEWEST_E2E_SKIP)' e2e/run.sh

e2e-matrix: deps images ## the e2e suite on $(K8S_RELEASE_OLDEST) (seed's beta flags), $(K8S_RELEASE_SEED) and $(K8S_RELEASE_NEWEST)
	@e2e/run.sh matrix

e2e-podgroups: deps images ## TestPodGroups on a local $(K8S_RELEASE_NEWEST) cluster with PodGroups served (their gates and scheduling.k8s.io/v1beta1 on)
	@e2e/run.sh podgroups

e2e-multinode: deps images ## the multi-node suite on a local cluster of NODES (default 3) GPU nodes, each a set of namespaces of this machine
	@e2e/run.sh multinode

e2e-upgrade: deps images ## the seed's story as an in-place upgrade $(K8S_RELEASE_OLDEST) -> $(K8S_RELEASE_UPGRADE_VIA) -> $(K8S_RELEASE_SEED) (own cluster; ~25 min cold)
	@e2e/clusterupgrade.sh

e2e-upgrade-newest: deps images ## in place from $(K8S_RELEASE_SEED) -> $(K8S_RELEASES_TO_NEWEST) -> $(K8S_RELEASE_NEWEST), kubelet last; features switch on, storage migrated, preflight for 1.38 (own cluster)
	@e2e/clusterupgrade-newest.sh

# The demo shows the newest release unless K8S_VERSION is given (`make demo K8S_VERSION=1.34.2`).
demo: K8S_VERSION = $(NEWEST_K8S_VERSION)
demo: deps images ## a local cluster on the newest release, the chart installed, the seed's example and the tour run and shown
	@e2e/demo.sh

e2e-all: deps images ## make test's end-to-end part: e2e on $(K8S_RELEASE_SEED) with e2e-multinode on $(K8S_RELEASE_NEWEST) beside it, then e2e-newest and e2e-podgroups
	@NEWEST_E2E_SKIP='$(NEWEST_E2E_SKIP)' e2e/run.sh all

test: deps lint integration fuzz e2e-all ## everything: lint, unit, integration, fuzz, e2e on $(K8S_RELEASE_SEED) and (but chaos) on $(K8S_RELEASE_NEWEST), its PodGroup phase, the multi-node suite

clean:
	rm -rf _output
