package plugin

import (
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
)

// EventRecorder records Events (k8s.io/client-go/tools/record implements it). The annotations of
// an Event are part of its rate limit's key (NewEventBroadcaster).
type EventRecorder interface {
	AnnotatedEventf(object runtime.Object, annotations map[string]string, eventtype, reason, messageFmt string, args ...any)
}

// The rate limit of device health Events, per pod, device and reason (token bucket, as the
// kubelet's recorder limits its Events per object): EventBurst at once, then one more every
// EventRefill. A device whose fault flaps tells each of its pods about it EventBurst times
// (DeviceUnhealthy and as many DeviceRecovered), then once in EventRefill at most, however
// often it flaps; other devices and pods keep their own budget.
const (
	EventBurst  = 5
	EventRefill = 5 * time.Minute
)

// EventOption configures NewEventBroadcaster.
type EventOption func(*record.CorrelatorOptions)

// WithEventClock runs the rate limit on c (tests step a fake clock through the refill).
func WithEventClock(c clock.PassiveClock) EventOption {
	return func(o *record.CorrelatorOptions) { o.Clock = c }
}

// NewEventBroadcaster returns client-go's Event broadcaster with its correlator keyed per Event
// object, reason and annotations (the device, see NotifyPods): the spam filter drops what exceeds
// EventBurst and EventRefill. An Event repeated as it was is a count on the first (a patch, which
// the filter counts too). Events that differ only in their message (another XID) are not combined
// into one "combined from similar events", as the kubelet's are: that Event would lose the
// annotations and with them its device's budget. The correlator remembers the budgets of the 4,096
// keys last used (its default, the kubelet's too: maxEventPods pods with 8 devices each, both
// reasons); a key it forgot starts with a full budget. The broadcaster queues at most 1,000 Events
// and drops what comes on top, so one change costs bounded memory however many pods it concerns.
func NewEventBroadcaster(opts ...EventOption) record.EventBroadcaster {
	o := record.CorrelatorOptions{
		BurstSize:   EventBurst,
		QPS:         float32(1 / EventRefill.Seconds()),
		SpamKeyFunc: eventKey,
		// One local key per group: the aggregator never reaches its threshold.
		KeyFunc: func(e *corev1.Event) (string, string) { return eventKey(e), "" },
	}
	for _, opt := range opts {
		opt(&o)
	}
	return record.NewBroadcaster(record.WithCorrelatorOptions(o))
}

// eventKey is the rate limit's key: source, object, type, reason and annotations.
func eventKey(e *corev1.Event) string {
	o := e.InvolvedObject
	return strings.Join([]string{e.Source.Component, e.Source.Host, o.Kind, o.Namespace, o.Name, string(o.UID),
		o.APIVersion, e.Type, e.Reason, annotationsKey(e.Annotations)}, "\x00")
}

func annotationsKey(a map[string]string) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(a)) {
		b.WriteString(k + "=" + a[k] + "\x00")
	}
	return b.String()
}
