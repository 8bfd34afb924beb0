package upgradecheck

import (
	"slices"
	"testing"
)

// TestLifecycles: the table read from k8s.io/api's lifecycle methods says what the Kubernetes
// deprecation guide and the 1.35+ warning ("deprecated in v1.35+, unavailable in v1.38+") say
// about v1beta1, keeps v1 forever, and ends v1beta2 after v1beta1.
func TestLifecycles(t *testing.T) {
	want := map[string][2]string{"v1": {"", ""}, "v1beta2": {"1.36", "1.39"}, "v1beta1": {"1.35", "1.38"}}
	got := Lifecycles()
	if len(got) != len(want) {
		t.Fatalf("lifecycles %+v, want one per version of %v", got, want)
	}
	for _, l := range got {
		w := want[l.Version]
		if s := str(l.Deprecated); s != w[0] {
			t.Errorf("%s deprecated %q, want %q", l.Version, s, w[0])
		}
		if s := str(l.Removed); s != w[1] {
			t.Errorf("%s removed %q, want %q", l.Version, s, w[1])
		}
	}
	for _, tc := range []struct {
		target string
		kept   []string
	}{
		{"1.37", []string{"v1", "v1beta2", "v1beta1"}},
		{"1.38", []string{"v1", "v1beta2"}},
		{"v1.39.0", []string{"v1"}},
	} {
		r, err := ParseRelease(tc.target)
		if err != nil {
			t.Fatal(err)
		}
		if k := Kept(r); !slices.Equal(k, tc.kept) {
			t.Errorf("Kept(%s) = %v, want %v", tc.target, k, tc.kept)
		}
	}
	if f := FirstRemoval(); f.String() != "1.38" {
		t.Errorf("FirstRemoval = %s, want 1.38", f)
	}
}

func TestParseRelease(t *testing.T) {
	for _, bad := range []string{"", "1", "38", "1.x", "v1.38.0.1", "-1.2", "latest"} {
		if _, err := ParseRelease(bad); err == nil {
			t.Errorf("ParseRelease(%q): no error", bad)
		}
	}
}

func str(r *Release) string {
	if r == nil {
		return ""
	}
	return r.String()
}
