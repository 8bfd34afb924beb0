#!/usr/bin/env bash
# `make demo`: a real local cluster (or $KUBECONFIG's), the chart installed, the seed's example run,
# then the product's tour: the annotation, two pods sharing one GPU's memory, a fault turning into a
# taint, `kubectl dra status` and `why`, the seed's 1.32 manifest fixed by `kubectl dra upgrade`, and
# a partitioned GPU. Each step that needs a newer release than the cluster's says so in one line.
# The cluster keeps running afterwards; `make cluster-down` stops it.
set -euo pipefail
source "$(dirname "$0")/cluster/lib.sh"
REPO=$(cd "$HERE/../.." && pwd)
cd "$REPO"
SEED=e2e/testdata/seed
down_cmd="make cluster-down"
NS=${DEMO_NAMESPACE:-default}
DRA=$REPO/_output/bin/kubectl-dra
summary=()
add() { summary+=("$*"); }
# addcmd CMD...: CMD's output lines, indented, into the summary.
addcmd() { local line; while IFS= read -r line; do add "  $line"; done < <("$@" 2>&1 || true); }

start_cluster() {
  step "gpu-dra demo: Kubernetes v$K8S_VERSION, chart charts/gpu-dra, the seed's example"
  if [ -z "${KUBECONFIG:-}" ]; then
    if [ ! -x "$(k8s_bin_dir "$K8S_VERSION")/kube-apiserver" ]; then
      note "first run on this machine: Kubernetes v$K8S_VERSION is built from source once (about 15 minutes on 2 cores, then cached)"
    fi
    if [ -n "${NODES:-}" ]; then
      # Several GPU nodes, as the seed's cluster has: each its own kubelet, containerd and plugin.
      source "$HERE/multinode-lib.sh"
      MODE=multinode "$HERE/up.sh"
      export KUBECONFIG=$MN_KUBECONFIG
      KUBECONFIG_PATH=$MN_KUBECONFIG
      down_cmd="make cluster-down MODE=multinode"
    else
      MODE=full "$HERE/up.sh"
      export KUBECONFIG=$KUBECONFIG_PATH
    fi
  else
    step "using the cluster of KUBECONFIG=$KUBECONFIG"
    "$HERE/build-k8s.sh" "$K8S_VERSION" >/dev/null
  fi
  export PATH=$(k8s_bin_dir "$K8S_VERSION"):$(tools_bin_dir):$PATH
  version=$(kubectl api-versions | grep '^resource.k8s.io/' | sed 's#resource.k8s.io/##' | sort -r | head -1)
  node=$(kubectl get nodes -o jsonpath='{.items[0].metadata.name}')
  nodes=$(kubectl get nodes --no-headers | wc -l)
  add "cluster:   $(kubectl version -o json | sed -n 's/.*"gitVersion": "\(v[^"]*\)".*/\1/p' | tail -1), $([ "$nodes" = 1 ] && echo "node $node" || echo "$nodes nodes: $(kubectl get nodes -o jsonpath='{.items[*].metadata.name}')"), resource.k8s.io/$version"
}

# served FIELD: whether the API server keeps a ResourceSlice device field that a feature gate guards
# (a server-side dry run, as the plugin's own probe does).
served() {
  local got
  got=$(kubectl create --dry-run=server -o jsonpath="{.spec.devices[0].$1}" -f - 2>/dev/null <<'YAML' || true
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {generateName: demo-probe-}
spec:
  driver: probe.example.com
  allNodes: true
  pool: {name: probe, resourceSliceCount: 1}
  devices:
  - name: d
    allowMultipleAllocations: true
    taints: [{key: probe.example.com/x, effect: NoSchedule}]
    capacity: {memory: {value: 1Gi}}
YAML
)
  [ -n "$got" ]
}

install_chart() {
  "$HERE/build-tools.sh" helm   # cold: about 2 minutes, with its own progress lines
  step "installing the chart (helm upgrade --install gpu-dra charts/gpu-dra -n gpu-dra $*)"
  helm upgrade --install gpu-dra charts/gpu-dra -n gpu-dra --create-namespace --wait --timeout 5m \
    --set image.repository="${PROJECT_IMAGE%:*}" --set image.tag="${PROJECT_IMAGE##*:}" --set image.pullPolicy=Never "$@" >/dev/null
  note "chart installed: $(kubectl -n gpu-dra get pods --no-headers | awk '{print $1" "$3}' | tr '\n' ';')"
}

# gpus: the node's devices from its ResourceSlices (name, model, memory, uuid, taints).
gpus() {
  kubectl get resourceslices --field-selector "spec.driver=gpu.example.com,spec.nodeName=$node" -o go-template='{{range .items}}{{range .spec.devices}}{{.name}}{{"\t"}}{{.attributes.model.string}}{{"\t"}}{{.capacity.memory.value}}{{"\t"}}{{.attributes.uuid.string}}{{range .taints}}{{"\t"}}taint {{.key}}={{.value}}:{{.effect}}{{end}}{{"\n"}}{{end}}{{end}}' | column -t
}

# annotated NAME KEY=VALUE...: a busybox pod with the given annotations that prints its GPUs and sleeps.
# On several nodes the tour's pods stay on the first, so that what it shows of one node holds.
annotated() {
  local name=$1 a annotations="" pin=""; shift
  for a in "$@"; do annotations+="    ${a%%=*}: \"${a#*=}\""$'\n'; done
  [ "$nodes" = 1 ] || pin="  nodeSelector: {kubernetes.io/hostname: $node}"
  kubectl -n "$NS" delete pod "$name" --ignore-not-found --wait >/dev/null
  kubectl -n "$NS" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata:
  name: $name
  annotations:
$annotations
spec:
$pin
  restartPolicy: Never
  containers:
  - name: app
    image: busybox:1.37.0-glibc   # the seed pod's image (imported locally; no registry here)
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "env | grep ^GPU_DEVICE | sort; sleep 600"]
YAML
}

seed_example() {
  tmpl=$SEED/resourceclaimtemplate.v1.yaml
  [ "$version" = v1 ] || tmpl=$SEED/resourceclaimtemplate.v1beta1.yaml
  # Ready pods are not yet a serving webhook: Service rules and the caBundle follow within seconds.
  wait_for 60 "the webhook to answer the API server" kubectl -n "$NS" apply --dry-run=server -f "$tmpl"
  step "waiting for the node's ResourceSlice"
  wait_for 120 "a ResourceSlice of gpu.example.com on each of the $nodes node(s)" sh -c "[ \$(kubectl get resourceslices --field-selector spec.driver=gpu.example.com -o name | wc -l) -ge $nodes ]"
  add "kubectl get resourceslice:"
  addcmd kubectl get resourceslice
  add "GPUs on node $node (from its ResourceSlice):"
  addcmd gpus

  step "the seed's ResourceClaimTemplate ($version form) and Pod"
  kubectl -n "$NS" delete pod example-claim --ignore-not-found --wait >/dev/null
  kubectl -n "$NS" apply -f "$tmpl" >/dev/null
  kubectl -n "$NS" apply -f $SEED/pod.yaml >/dev/null
  local states=() st
  for _ in $(seq 1 120); do
    st=$(kubectl -n "$NS" get resourceclaims --no-headers 2>/dev/null | awk '/^example-claim-example/{print $2; exit}')
    [ -n "$st" ] && { [ ${#states[@]} -gt 0 ] && [ "${states[-1]}" = "$st" ] || states+=("$st"); }
    [ "$(kubectl -n "$NS" get pod example-claim -o jsonpath='{.status.phase}')" = Running ] && [ "$st" = "allocated,reserved" ] && break
    sleep 0.5
  done
  local claim
  claim=$(kubectl -n "$NS" get resourceclaims --no-headers | awk '/^example-claim-example/{print $1; exit}')
  add "seed pod example-claim: $(kubectl -n "$NS" get pod example-claim -o jsonpath='{.status.phase}'), claim $claim went: ${states[*]}"
  addcmd kubectl -n "$NS" exec example-claim -- sh -c 'env | grep ^GPU_DEVICE | sort'
}

annotation() {
  step "a pod with only the annotation gpu.example.com/count: \"2\""
  annotated demo-annotated gpu.example.com/count=2
  kubectl -n "$NS" wait --for=condition=Ready pod/demo-annotated --timeout=120s >/dev/null
  add "annotated pod demo-annotated: $(kubectl -n "$NS" get pod demo-annotated -o jsonpath='{.spec.resourceClaims[0].resourceClaimTemplateName}') injected"
  addcmd kubectl -n "$NS" exec demo-annotated -- sh -c 'env | grep -E "^GPU_DEVICE_[0-9]+=" | sort'
}

memory_sharing() {
  step "two pods sharing one GPU's memory (annotation gpu.example.com/memory)"
  if [ "$shares" != true ]; then
    add "memory sharing: skipped: needs 1.36+ (this API server does not serve consumable capacity, DRAConsumableCapacity)"
    return
  fi
  local p claim devices=()
  for p in a b; do annotated "demo-share-$p" gpu.example.com/count=1 gpu.example.com/memory=10Gi; done
  for p in a b; do
    kubectl -n "$NS" wait --for=condition=Ready "pod/demo-share-$p" --timeout=120s >/dev/null
    claim=$(kubectl -n "$NS" get pod "demo-share-$p" -o jsonpath='{.status.resourceClaimStatuses[0].resourceClaimName}')
    devices+=("$(kubectl -n "$NS" get resourceclaim "$claim" -o jsonpath='{.status.allocation.devices.results[0].device} share {.status.allocation.devices.results[0].shareID}')")
    add "shared pod demo-share-$p: claim $claim, ${devices[-1]}"
    addcmd kubectl -n "$NS" exec "demo-share-$p" -- sh -c 'env | grep ^GPU_DEVICE | sort'
  done
  if [ "${devices[0]%% *}" = "${devices[1]%% *}" ]; then
    add "  both pods share ${devices[0]%% *}: 10Gi of its memory each"
  else
    add "  the pods got shares of different GPUs: ${devices[0]%% *}, ${devices[1]%% *}"
  fi
}

fault_to_taint() {
  step "a simulated fault: kubectl dra fault set $node/gpu-7 --kind xid"
  "$DRA" fault set "$node/gpu-7" --kind xid --message "XID 79: GPU has fallen off the bus" -n gpu-dra >/dev/null
  if [ "$taints" != true ]; then
    add "fault on gpu-7: reported to the kubelet and in metrics; no taint: needs 1.36+ (this API server drops device taints, DRADeviceTaints)"
    return
  fi
  wait_for 60 "the taint on gpu-7" sh -c "kubectl get resourceslices --field-selector spec.driver=gpu.example.com -o jsonpath='{.items[*].spec.devices[?(@.name==\"gpu-7\")].taints[*].key}' | grep -q unhealthy"
  add "fault on gpu-7 became a taint in its ResourceSlice:"
  addcmd sh -c "node=$node; $(declare -f gpus); gpus | grep '^gpu-7 '"
}

status_and_why() {
  step "kubectl dra status, and why a pod waits"
  add "kubectl dra status:"
  addcmd "$DRA" status
  # More GPUs than are free now: admitted (a node could hold them) but pending until GPUs free up.
  annotated demo-waiting gpu.example.com/count=8
  wait_for 60 "demo-waiting to be unschedulable" sh -c "kubectl -n $NS get pod demo-waiting -o jsonpath='{.status.conditions[?(@.type==\"PodScheduled\")].reason}' | grep -q Unschedulable"
  add "kubectl dra why pod/demo-waiting (annotated gpu.example.com/count: \"8\"):"
  addcmd "$DRA" why pod/demo-waiting -n "$NS"
  kubectl -n "$NS" delete pod demo-waiting --wait=false >/dev/null
  "$DRA" fault clear "$node/gpu-7" -n gpu-dra >/dev/null
}

old_manifest() {
  step "the seed's 1.32 (resource.k8s.io/v1beta1) template, then kubectl dra upgrade"
  local old out
  old=$(sed 's/name: example$/name: example-132/' "$SEED/resourceclaimtemplate.v1beta1.yaml")
  if out=$(kubectl -n "$NS" apply --dry-run=server -f - <<<"$old" 2>&1); then
    add "1.32 template applied as it is (this cluster still serves v1beta1): $out"
  else
    # kubectl's first line says why; its second is a hint about CRDs that does not apply here.
    add "1.32 template refused by the cluster:"
    add "  $(head -1 <<<"$out")"
  fi
  out=$("$DRA" upgrade -f - <<<"$old" | kubectl -n "$NS" apply -f - 2>&1)
  add "kubectl dra upgrade -f old.yaml | kubectl apply -f -: $out"
}

partitions() {
  step "a partitioned GPU (the reference driver's partitionable-devices demo)"
  kubectl -n "$NS" delete pod example-claim demo-annotated demo-share-a demo-share-b --ignore-not-found --wait >/dev/null
  install_chart --set 'inventory.nodeGroups[0].name=partitioned' --set 'inventory.nodeGroups[0].count=2' --set 'inventory.nodeGroups[0].sharing.mode=partitioned' \
    --set 'inventory.nodeGroups[0].sharing.partitions=4'
  if ! wait_for_partitions; then
    add "partitions: the plugin published whole GPUs: needs 1.36+ (this API server does not serve partitionable devices, DRAPartitionableDevices)"
    return
  fi
  kubectl apply -f e2e/testdata/upstream/partitionable-devices.yaml >/dev/null
  kubectl -n partitionable-devices wait --for=condition=Ready pod/pod0 --timeout=120s >/dev/null
  add "pod0 (a claim for 2 devices of the class) got partitions of one GPU:"
  addcmd kubectl -n partitionable-devices get resourceclaims -o jsonpath='{range .items[*].status.allocation.devices.results[*]}{.device}{"\n"}{end}'
  addcmd kubectl -n partitionable-devices exec pod0 -- sh -c 'env | grep ^GPU_DEVICE | sort'
}

wait_for_partitions() {
  local s
  for s in $(seq 1 60); do
    kubectl get resourceslices --field-selector spec.driver=gpu.example.com -o jsonpath='{.items[*].spec.devices[*].name}' | grep -q partition && return 0
    sleep 1
  done
  return 1
}

bad_template() {
  step "a template with a typo in its selector"
  local bad
  bad=$(sed 's/\.model ==/.modle ==/' "$tmpl" | sed 's/name: example$/name: example-typo/' | kubectl -n "$NS" apply --dry-run=server -f - 2>&1 || true)
  add "bad template (modle instead of model):"
  add "  $bad"
}

start_cluster
shares=false; served allowMultipleAllocations && shares=true
taints=false; served taints && taints=true
sharing=()
# Whole-GPU claims (the seed's, count-only pods) still get a whole GPU: a claim that names no
# memory takes all of it. Pods with gpu.example.com/memory get a share.
[ "$shares" = true ] && sharing=(--set 'inventory.nodeGroups[0].name=shared' --set 'inventory.nodeGroups[0].sharing.mode=shared-memory')
install_chart "${sharing[@]}"
seed_example
annotation
memory_sharing
fault_to_taint
status_and_why
bad_template
old_manifest
partitions

echo
echo "================ gpu-dra demo summary ================"
printf '%s\n' "${summary[@]}"
echo "======================================================"
echo "The cluster keeps running:  export KUBECONFIG=$KUBECONFIG"
[ -n "${KUBECONFIG_PATH:-}" ] && [ "$KUBECONFIG" = "$KUBECONFIG_PATH" ] && echo "Stop it with:               $down_cmd"
true
