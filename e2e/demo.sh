#!/usr/bin/env bash
# `make demo`: a real local cluster (or $KUBECONFIG's), the chart installed, the seed's example run,
# and a short summary. The cluster keeps running afterwards; `make cluster-down` stops it.
set -euo pipefail
source "$(dirname "$0")/cluster/lib.sh"
REPO=$(cd "$HERE/../.." && pwd)
cd "$REPO"
SEED=e2e/testdata/seed
NS=${DEMO_NAMESPACE:-default}
summary=()
add() { summary+=("$*"); }

step "gpu-dra demo: Kubernetes v$K8S_VERSION, chart charts/gpu-dra, the seed's example"
if [ -z "${KUBECONFIG:-}" ]; then
  if [ ! -x "$(k8s_bin_dir "$K8S_VERSION")/kube-apiserver" ]; then
    note "first run on this machine: Kubernetes v$K8S_VERSION is built from source once (about 15 minutes on 2 cores, then cached)"
  fi
  MODE=full "$HERE/up.sh"
  export KUBECONFIG=$KUBECONFIG_PATH
else
  step "using the cluster of KUBECONFIG=$KUBECONFIG"
  "$HERE/build-k8s.sh" "$K8S_VERSION" >/dev/null
fi
export PATH=$(k8s_bin_dir "$K8S_VERSION"):$(tools_bin_dir):$PATH
version=$(kubectl api-versions | grep '^resource.k8s.io/' | sed 's#resource.k8s.io/##' | sort -r | head -1)
node=$(kubectl get nodes -o jsonpath='{.items[0].metadata.name}')
add "cluster:   $(kubectl version -o json | sed -n 's/.*"gitVersion": "\(v[^"]*\)".*/\1/p' | tail -1), node $node, resource.k8s.io/$version"

if [ ! -d charts/gpu-dra ]; then
  # Until the chart lands the demo proves the cluster itself: a pod runs and its output comes back.
  step "running a smoke pod"
  kubectl -n "$NS" delete pod demo-smoke --ignore-not-found --wait >/dev/null
  kubectl -n "$NS" run demo-smoke --image=docker.io/library/busybox:1.35 --image-pull-policy=Never --restart=Never \
    --command -- sh -c 'echo "hello from a pod on $(hostname)"' >/dev/null
  kubectl -n "$NS" wait --for=jsonpath='{.status.phase}'=Succeeded pod/demo-smoke --timeout=120s >/dev/null
  add "smoke pod: $(kubectl -n "$NS" logs demo-smoke)"
else
  "$HERE/build-tools.sh" helm   # cold: about 2 minutes, with its own progress lines
  # Sharing a GPU's memory needs an API server that keeps allowMultipleAllocations (consumable
  # capacity, on by default from 1.36): a dry-run slice tells, as the plugin's own probe does.
  shares=$(kubectl create --dry-run=server -o jsonpath='{.spec.devices[0].allowMultipleAllocations}' -f - 2>/dev/null <<'YAML' || true
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
    capacity: {memory: {value: 1Gi}}
YAML
)
  sharing=()
  # Whole-GPU claims (the seed's, count-only pods) still get a whole GPU: a claim that names no
  # memory takes all of it. Pods with gpu.example.com/memory get a share.
  [ "$shares" = true ] && sharing=(--set 'inventory.nodeGroups[0].name=shared' --set 'inventory.nodeGroups[0].sharing.mode=shared-memory')
  step "installing the chart (helm upgrade --install gpu-dra charts/gpu-dra -n gpu-dra${sharing[*]:+ ${sharing[*]}})"
  helm upgrade --install gpu-dra charts/gpu-dra -n gpu-dra --create-namespace --wait --timeout 5m \
    --set image.repository="${PROJECT_IMAGE%:*}" --set image.tag="${PROJECT_IMAGE##*:}" --set image.pullPolicy=Never "${sharing[@]}" >/dev/null
  note "chart installed: $(kubectl -n gpu-dra get pods --no-headers | awk '{print $1" "$3}' | tr '\n' ';' )"

  tmpl=$SEED/resourceclaimtemplate.v1.yaml
  [ "$version" = v1 ] || tmpl=$SEED/resourceclaimtemplate.v1beta1.yaml
  # Ready pods are not yet a serving webhook: Service rules and the caBundle follow within seconds.
  wait_for 60 "the webhook to answer the API server" kubectl -n "$NS" apply --dry-run=server -f "$tmpl"
  step "waiting for the node's ResourceSlice"
  wait_for 120 "ResourceSlice of gpu.example.com" sh -c "kubectl get resourceslices --field-selector spec.driver=gpu.example.com -o name | grep -q ."
  add "GPUs on node $node (from its ResourceSlice):"
  while read -r line; do add "  $line"; done < <(kubectl get resourceslices --field-selector spec.driver=gpu.example.com -o go-template='{{range .items}}{{range .spec.devices}}{{.name}}{{"\t"}}{{with .basic}}{{.attributes.model.string}}{{else}}{{.attributes.model.string}}{{end}}{{"\t"}}{{with .basic}}{{.capacity.memory.value}}{{else}}{{.capacity.memory.value}}{{end}}{{"\t"}}{{with .basic}}{{.attributes.uuid.string}}{{else}}{{.attributes.uuid.string}}{{end}}{{"\n"}}{{end}}{{end}}' | column -t)

  step "the seed's ResourceClaimTemplate ($version form) and Pod"
  kubectl -n "$NS" delete pod example-claim --ignore-not-found --wait >/dev/null
  kubectl -n "$NS" apply -f "$tmpl" >/dev/null
  kubectl -n "$NS" apply -f $SEED/pod.yaml >/dev/null
  states=()
  for _ in $(seq 1 120); do
    st=$(kubectl -n "$NS" get resourceclaims --no-headers 2>/dev/null | awk '/^example-claim-example/{print $2; exit}')
    [ -n "$st" ] && { [ ${#states[@]} -gt 0 ] && [ "${states[-1]}" = "$st" ] || states+=("$st"); }
    [ "$(kubectl -n "$NS" get pod example-claim -o jsonpath='{.status.phase}')" = Running ] && [ "$st" = "allocated,reserved" ] && break
    sleep 0.5
  done
  claim=$(kubectl -n "$NS" get resourceclaims --no-headers | awk '/^example-claim-example/{print $1; exit}')
  add "seed pod example-claim: $(kubectl -n "$NS" get pod example-claim -o jsonpath='{.status.phase}'), claim $claim went: ${states[*]}"
  while read -r line; do add "  $line"; done < <(kubectl -n "$NS" exec example-claim -- sh -c 'env | grep ^GPU_DEVICE | sort')

  step "a pod with only the annotation gpu.example.com/count: \"2\""
  kubectl -n "$NS" delete pod demo-annotated --ignore-not-found --wait >/dev/null
  kubectl -n "$NS" apply -f - >/dev/null <<'YAML'
apiVersion: v1
kind: Pod
metadata:
  name: demo-annotated
  annotations:
    gpu.example.com/count: "2"
spec:
  restartPolicy: Never
  containers:
  - name: app
    image: busybox:1.37.0-glibc   # the seed pod's image (imported locally; no registry here)
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "env | grep ^GPU_DEVICE | sort; sleep 600"]
YAML
  kubectl -n "$NS" wait --for=condition=Ready pod/demo-annotated --timeout=120s >/dev/null
  add "annotated pod demo-annotated: $(kubectl -n "$NS" get pod demo-annotated -o jsonpath='{.spec.resourceClaims[0].resourceClaimTemplateName}') injected"
  while read -r line; do add "  $line"; done < <(kubectl -n "$NS" exec demo-annotated -- sh -c 'env | grep -E "^GPU_DEVICE_[0-9]+=" | sort')

  step "two pods sharing one GPU's memory (annotation gpu.example.com/memory)"
  if [ "$shares" != true ]; then
    add "memory sharing: skipped: needs 1.36+ (this API server does not serve consumable capacity, DRAConsumableCapacity)"
  else
    for p in a b; do
      kubectl -n "$NS" delete pod "demo-share-$p" --ignore-not-found --wait >/dev/null
      kubectl -n "$NS" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata:
  name: demo-share-$p
  annotations:
    gpu.example.com/count: "1"
    gpu.example.com/memory: 10Gi
spec:
  restartPolicy: Never
  containers:
  - name: app
    image: busybox:1.37.0-glibc
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "sleep 600"]
YAML
    done
    devices=()
    for p in a b; do
      kubectl -n "$NS" wait --for=condition=Ready "pod/demo-share-$p" --timeout=120s >/dev/null
      claim=$(kubectl -n "$NS" get pod "demo-share-$p" -o jsonpath='{.status.resourceClaimStatuses[0].resourceClaimName}')
      devices+=("$(kubectl -n "$NS" get resourceclaim "$claim" -o jsonpath='{.status.allocation.devices.results[0].device} share {.status.allocation.devices.results[0].shareID}')")
      add "shared pod demo-share-$p: claim $claim, ${devices[-1]}"
      while read -r line; do add "  $line"; done < <(kubectl -n "$NS" exec "demo-share-$p" -- sh -c 'env | grep ^GPU_DEVICE | sort')
    done
    if [ "${devices[0]%% *}" = "${devices[1]%% *}" ]; then
      add "  both pods share ${devices[0]%% *}: 10Gi of its memory each"
    else
      add "  the pods got shares of different GPUs: ${devices[0]%% *}, ${devices[1]%% *}"
    fi
  fi

  step "a template with a typo in its selector"
  bad=$(sed 's/\.model ==/.modle ==/' "$tmpl" | sed 's/name: example$/name: example-typo/' | kubectl -n "$NS" apply --dry-run=server -f - 2>&1 || true)
  add "bad template (modle instead of model):"
  add "  $bad"
fi

echo
echo "================ gpu-dra demo summary ================"
printf '%s\n' "${summary[@]}"
echo "======================================================"
echo "The cluster keeps running:  export KUBECONFIG=$KUBECONFIG"
[ -n "${KUBECONFIG_PATH:-}" ] && [ "$KUBECONFIG" = "$KUBECONFIG_PATH" ] && echo "Stop it with:               make cluster-down"
true
