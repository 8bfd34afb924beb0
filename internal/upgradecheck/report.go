package upgradecheck

// Status is the outcome of one check and of the whole report.
type Status string

const (
	// Safe: nothing found that the target release breaks.
	Safe Status = "safe"
	// NotSafe: something found that the target release breaks; the finding says how to fix it.
	NotSafe Status = "not safe"
	// Unknown: the check could not tell (no permission, API not served); the finding says why.
	Unknown Status = "could not tell"
)

// worst combines two outcomes: not safe over could not tell over safe.
func worst(a, b Status) Status {
	rank := map[Status]int{Safe: 0, "": 0, Unknown: 1, NotSafe: 2}
	if rank[b] > rank[a] {
		return b
	}
	if a == "" {
		return Safe
	}
	return a
}

// Report is everything kubectl dra preflight prints; it is also its JSON output.
type Report struct {
	Target  string   `json:"target"`
	Verdict Status   `json:"verdict"`
	Cluster *Cluster `json:"cluster,omitempty"`
	// ClusterSkipped says why the cluster was not checked, when it was not.
	ClusterSkipped string     `json:"clusterSkipped,omitempty"`
	Manifests      *Manifests `json:"manifests,omitempty"`
}

// Cluster is what the live cluster showed.
type Cluster struct {
	Versions Versions `json:"versions"`
	Storage  Storage  `json:"storage"`
	Clients  Clients  `json:"clients"`
	Install  Install  `json:"install"`
}

// Versions compares what the cluster serves with what the target keeps.
type Versions struct {
	Status Status `json:"status"`
	// Server is the API server's version, e.g. v1.34.2.
	Server string `json:"server,omitempty"`
	// Served are the resource.k8s.io versions the cluster serves, newest first.
	Served []string `json:"served"`
	// Kept are the versions the target can still serve (some only when enabled).
	Kept []string `json:"kept"`
	// Dropped are the versions served now that the target no longer serves.
	Dropped []string `json:"dropped,omitempty"`
	Notes   []string `json:"notes,omitempty"`
}

// Storage says whether the group's objects are known to be rewritten in the current storage
// version.
type Storage struct {
	Status Status `json:"status"`
	// Source is where the answer comes from: an API (storagemigration.k8s.io/v1) or "".
	Source    string           `json:"source,omitempty"`
	Resources []StoredResource `json:"resources"`
	Reason    string           `json:"reason,omitempty"`
	Fix       string           `json:"fix,omitempty"`
}

// StoredResource is one resource of the group.
type StoredResource struct {
	Resource string `json:"resource"`
	Objects  int    `json:"objects"`
	// Encoding is the version the API server writes it in, where the StorageVersion API says.
	Encoding string `json:"encoding,omitempty"`
	// Migration names the StorageVersionMigration that rewrote its objects.
	Migration string `json:"migration,omitempty"`
	// Rewrite describes the rewrite of all its objects kubectl dra migrate recorded, where no
	// StorageVersionMigration did the work.
	Rewrite string `json:"rewrite,omitempty"`
	Status  Status `json:"status"`
}

// Clients lists the deprecated versions clients requested since the API server started.
type Clients struct {
	Status   Status              `json:"status"`
	Requests []DeprecatedRequest `json:"requests,omitempty"`
	Reason   string              `json:"reason,omitempty"`
}

// DeprecatedRequest is one series of apiserver_requested_deprecated_apis.
type DeprecatedRequest struct {
	Version        string `json:"version"`
	Resource       string `json:"resource"`
	Subresource    string `json:"subresource,omitempty"`
	RemovedRelease string `json:"removedRelease"`
	Status         Status `json:"status"`
}

// Install is the gpu-dra chart's objects found in the cluster.
type Install struct {
	Status     Status      `json:"status"`
	Components []Component `json:"components"`
	Reason     string      `json:"reason,omitempty"`
}

// Component is one object of a gpu-dra release.
type Component struct {
	Kind      string   `json:"kind"`
	Namespace string   `json:"namespace,omitempty"`
	Name      string   `json:"name"`
	Release   string   `json:"release,omitempty"`
	Chart     string   `json:"chart,omitempty"`
	Version   string   `json:"version,omitempty"`
	Images    []string `json:"images,omitempty"`
	Status    Status   `json:"status"`
	Note      string   `json:"note,omitempty"`
	Fix       string   `json:"fix,omitempty"`
}

// Manifests are the offline files' documents written in a version the target drops.
type Manifests struct {
	Status    Status     `json:"status"`
	Documents int        `json:"documents"`
	Findings  []Document `json:"findings,omitempty"`
}

// Document is one manifest document the target would refuse.
type Document struct {
	File       string `json:"file"`
	Document   int    `json:"document"`
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Namespace  string `json:"namespace,omitempty"`
	Name       string `json:"name"`
	Problem    string `json:"problem"`
	Fix        string `json:"fix"`
}

// finish sets the verdict from the sections' statuses.
func (r *Report) finish() {
	v := Safe
	if c := r.Cluster; c != nil {
		for _, s := range []Status{c.Versions.Status, c.Storage.Status, c.Clients.Status, c.Install.Status} {
			v = worst(v, s)
		}
	}
	if r.Manifests != nil {
		v = worst(v, r.Manifests.Status)
	}
	r.Verdict = v
}

// NewReport puts the cluster's findings (nil when it was not checked, skipped saying why) and the
// files' together and sets the verdict.
func NewReport(target Release, cl *Cluster, skipped string, sources []Source) *Report {
	r := &Report{Target: target.String(), Cluster: cl, ClusterSkipped: skipped}
	if target == (Release{}) {
		target = FirstRemoval()
		r.Target = target.String()
	}
	if sources != nil {
		r.Manifests = CheckManifests(sources, target)
	}
	r.finish()
	return r
}
