#!/usr/bin/env bash
# The benchmarks behind docs/performance.md, each COUNT times, summarized by benchstat.
# Loopback only; each benchmark runs a fixed number of operations.
set -euo pipefail
count=${COUNT:-5}
out=_output/bench.txt
mkdir -p _output
: > "$out"
run() { go test -run '^$' -count "$count" "$@" | tee -a "$out" | grep -E '^Benchmark' || true; }
run -bench 'BenchmarkValidate' -benchtime 3000x ./webhook/claimadmission
# The chart runs the webhook with GOGC=400 (values: webhook.gogc); so do its benchmarks.
GOGC=400 run -bench 'BenchmarkMutatePodLoopbackTLS' -benchtime 3000x ./webhook/podinject
GOGC=400 run -bench 'BenchmarkMutatePodLoadTool' -benchtime 3000x ./webhook/podinject
run -bench 'BenchmarkHandle|BenchmarkReview' -benchmem ./webhook/podinject
# A Node's watch event decoded and kept, as client-go's typed watch reads it and as the webhook does.
run -bench 'BenchmarkNodeWatchEvent' -benchtime 2000x ./internal/inventory
run -bench 'BenchmarkPrepareUnprepare' -benchtime 1000x ./cmd/gpu-kubelet-plugin
run -bench 'BenchmarkDriverPrepareUnprepare' -benchtime 1000x ./driver/plugin
# kubectl dra status and why against a real kube-apiserver with 1,000 nodes' slices (about a
# minute to populate per count).
run -bench 'BenchmarkFleet1000Nodes' -benchtime 5x ./cmd/kubectl-dra/app
"${BENCHSTAT:-benchstat}" "$out"
