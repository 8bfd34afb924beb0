#!/usr/bin/env bash
# Stop everything up.sh started and leave the machine clean: processes, pods and their shims,
# kubelet mounts, kube-proxy rules, the CNI bridge. WIPE=1 also deletes state (etcd data, images).
set -uo pipefail
source "$(dirname "$0")/lib.sh"
# The multi-node cluster has its own: it runs beside this one and each stops only its own.
[ "${MODE:-}" = multinode ] && exec "$HERE/multinode-down.sh"

# etcd is started by name from PATH: find it by its port and its executable, not its command line.
sweep_etcd() {
  local p
  for p in $(ss -ltnpH 'sport = :2379' 2>/dev/null | grep -o 'pid=[0-9]*' | cut -d= -f2 | sort -u); do
    case "$(readlink -f "/proc/$p/exe")" in "$CACHE"/tools/*) kill -KILL "$p" ;; esac
  done
}

wipe() {
  if [ "${WIPE:-0}" = 1 ]; then
    note "wiping state ($STATE, /var/lib/kubelet)"
    rm -rf "$STATE" /var/lib/kubelet
  fi
}

if [ ! -d "$STATE/run" ]; then
  sweep_etcd
  step "no local cluster state in $STATE; nothing to stop"
  wipe
  exit 0
fi
step "stopping the local cluster"
tbin=$(tools_bin_dir)

stop_pid "$(local_up_pidfile kubelet)" INT 60
stop_pid "$(local_up_pidfile controlplane)" INT 60
sweep_k8s kubelet kube-proxy kube-scheduler kube-controller-manager kube-apiserver
sweep_etcd
for p in "$STATE"/run/extra-*.pid; do [ -f "$p" ] && stop_pid "$p" TERM 10; done

if [ -S "$CONTAINERD_SOCK" ]; then
  note "removing pods and containers"
  CONTAINER_RUNTIME_ENDPOINT=unix://$CONTAINERD_SOCK timeout 60 "$tbin/crictl" rmp -fa >/dev/null 2>&1
fi
stop_pid "$STATE/run/containerd.pid" TERM 20
pkill -KILL -f "^$tbin/containerd-shim-runc-v2" 2>/dev/null

note "unmounting kubelet and containerd mounts"
for _ in 1 2 3; do
  grep -E " (/var/lib/kubelet|$RUN_DIR|$STATE)" /proc/mounts | awk '{print $2}' | sort -r | xargs -r -n1 umount 2>/dev/null
done
grep -E " (/var/lib/kubelet|$RUN_DIR|$STATE)" /proc/mounts | awk '{print $2}' | sort -r | xargs -r -n1 umount -l 2>/dev/null
proxy=$(ls "$CACHE"/k8s/v*/bin/kube-proxy 2>/dev/null | head -1)
if [ -n "$proxy" ]; then "$proxy" --cleanup >/dev/null 2>&1; fi
# kubelet's own chains (KUBE-FIREWALL, canaries) survive kube-proxy --cleanup.
for t in iptables ip6tables; do
  command -v $t-save >/dev/null || continue
  if $t-save 2>/dev/null | grep -q KUBE; then $t-save | grep -v KUBE | $t-restore 2>/dev/null; fi
done
ip link del gpudra0 2>/dev/null
rm -rf "$RUN_DIR" "$STATE/run" "$STATE/tmp" "$STATE/cni/ipam" /var/lib/kubelet/plugins_registry/*.sock 2>/dev/null
wipe
# Only what the cluster runs: other tools in $tbin (staticcheck, helm, prometheus) may be running
# for something else on this machine.
left=$(pgrep -af "^($K8S_BIN_RE/|$tbin/(containerd|containerd-shim-runc-v2|etcd|kwok)( |$))" || true)
[ -z "$left" ] || { echo "$left" >&2; die "processes survived cluster-down"; }
step "local cluster stopped"
