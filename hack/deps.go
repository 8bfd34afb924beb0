//go:build deps

// Package hack pins the module's direct dependencies before their users land.
package hack

import (
	_ "github.com/google/cel-go/cel"
	_ "github.com/google/go-containerregistry/pkg/v1/tarball"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "k8s.io/api/resource/v1"
	_ "k8s.io/client-go/kubernetes"
	_ "k8s.io/dynamic-resource-allocation/api"
	_ "k8s.io/dynamic-resource-allocation/cel"
	_ "k8s.io/dynamic-resource-allocation/client"
	_ "k8s.io/dynamic-resource-allocation/kubeletplugin"
	_ "k8s.io/dynamic-resource-allocation/resourceslice"
	_ "k8s.io/dynamic-resource-allocation/structured"
	_ "k8s.io/klog/v2"
	_ "k8s.io/kubelet/pkg/apis/dra/v1"
	_ "k8s.io/kubelet/pkg/apis/dra/v1beta1"
	_ "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	_ "sigs.k8s.io/controller-runtime/pkg/envtest"
	_ "sigs.k8s.io/controller-runtime/pkg/webhook"
	_ "sigs.k8s.io/yaml"
	_ "tags.cncf.io/container-device-interface/pkg/cdi"
	_ "tags.cncf.io/container-device-interface/specs-go"
)
