// Command apiprobe runs in a pod and proves that the pod reaches the API server through the
// `kubernetes` Service (kube-proxy) with its service account.
package main

import (
	"fmt"
	"os"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

func main() {
	cfg, err := rest.InClusterConfig()
	if err != nil {
		fmt.Fprintln(os.Stderr, "in-cluster config:", err)
		os.Exit(1)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "client:", err)
		os.Exit(1)
	}
	v, err := cs.Discovery().ServerVersion()
	if err != nil {
		fmt.Fprintf(os.Stderr, "GET %s/version: %v\n", cfg.Host, err)
		os.Exit(1)
	}
	fmt.Printf("apiserver %s reached via %s\n", v.GitVersion, cfg.Host)
}
