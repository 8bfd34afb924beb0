package upgradecheck

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/gpu-dra/gpu-dra/internal/resourceversion"
)

// deprecatedMetric is the API server's gauge of deprecated versions requested since it started
// (k8s.io/apiserver, stable).
const deprecatedMetric = "apiserver_requested_deprecated_apis"

// maxMetricLine bounds one line of /metrics; the API server's longest are histogram buckets with
// a few labels.
const maxMetricLine = 1 << 20

func checkClients(ctx context.Context, c Conn, o options, target Release) Clients {
	cl := Clients{Status: Safe}
	if c.Metrics == nil {
		return Clients{Status: Unknown, Reason: "no connection to the API server's /metrics"}
	}
	var reqs []DeprecatedRequest
	err := bounded(ctx, o, func(ctx context.Context) error {
		body, err := c.Metrics(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = body.Close() }()
		lim := &io.LimitedReader{R: body, N: o.maxMetrics + 1}
		reqs, err = DeprecatedRequests(lim)
		if err == nil && lim.N == 0 {
			err = fmt.Errorf("the answer is longer than %d bytes, the most this command reads", o.maxMetrics)
		}
		return err
	})
	switch {
	case apierrors.IsForbidden(err):
		return Clients{Status: Unknown, Reason: "may not read the API server's /metrics (403 Forbidden): " +
			"ask for get on the non-resource URL /metrics (e.g. the system:monitoring ClusterRole) to see which clients still request deprecated versions"}
	case err != nil:
		return Clients{Status: Unknown, Reason: fmt.Sprintf("read the API server's /metrics: %v", err)}
	}
	for _, r := range reqs {
		r.Status = Safe
		if rel, err := ParseRelease(r.RemovedRelease); err == nil && !target.Before(rel) {
			r.Status = NotSafe
		} else if l, ok := LifecycleOf(r.Version); ok && l.RemovedBy(target) {
			r.Status = NotSafe
		}
		cl.Status = worst(cl.Status, r.Status)
		cl.Requests = append(cl.Requests, r)
	}
	if cl.Status == NotSafe {
		cl.Reason = fmt.Sprintf("clients requested versions %s no longer serves since the API server started; find them in its audit log (or the apiserver_request_total metric's client labels) and move them to %s/%s", target, resourceversion.Group, Kept(target)[0])
	}
	return cl
}

// DeprecatedRequests reads the resource.k8s.io series of apiserver_requested_deprecated_apis from
// a /metrics answer in the Prometheus text format. Only that metric's lines are kept, so the
// cost is one pass over the input and memory for those lines.
func DeprecatedRequests(r io.Reader) ([]DeprecatedRequest, error) {
	var keep bytes.Buffer
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxMetricLine)
	for sc.Scan() {
		line := sc.Bytes()
		if bytes.HasPrefix(line, []byte(deprecatedMetric+"{")) || bytes.HasPrefix(line, []byte(deprecatedMetric+" ")) ||
			bytes.HasPrefix(line, []byte("# TYPE "+deprecatedMetric+" ")) {
			keep.Write(line)
			keep.WriteByte('\n')
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("a line of /metrics is longer than %d bytes", maxMetricLine)
		}
		return nil, err
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(&keep)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", deprecatedMetric, err)
	}
	var out []DeprecatedRequest
	if f := families[deprecatedMetric]; f != nil {
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["group"] != resourceversion.Group || (m.GetGauge() != nil && m.GetGauge().GetValue() == 0) {
				continue
			}
			out = append(out, DeprecatedRequest{Version: labels["version"], Resource: labels["resource"], Subresource: labels["subresource"], RemovedRelease: labels["removed_release"]})
		}
	}
	slices.SortFunc(out, func(a, b DeprecatedRequest) int {
		return strings.Compare(a.Version+"/"+a.Resource+"/"+a.Subresource, b.Version+"/"+b.Resource+"/"+b.Subresource)
	})
	return out, nil
}
