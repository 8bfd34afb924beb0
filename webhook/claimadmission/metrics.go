package claimadmission

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// verdicts counts admission outcomes; controller-runtime already exports request counts and
// latency per webhook path, this adds what the checks found.
var verdicts = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "gpu_dra_claim_validation_verdicts_total",
	Help: "ResourceClaim and ResourceClaimTemplate admissions by verdict (allowed, warned, denied), kind and arrived API version.",
}, []string{"verdict", "kind", "version"})

func init() {
	metrics.Registry.MustRegister(verdicts)
}
