package cliflag

import (
	"flag"
	"io"
	"slices"
	"strings"
	"testing"
)

func TestList(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{name: "unset", want: []string{"default"}},
		{name: "trimmed, blanks dropped", args: []string{"--items= a, b,,c ,"}, want: []string{"a", "b", "c"}},
		{name: "a later use replaces", args: []string{"--items=a,b", "--items=c"}, want: []string{"c"}},
		{name: "empty clears", args: []string{"--items=a", "--items="}, want: nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := []string{"default"}
			fs := flag.NewFlagSet("test", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			List(fs, "items", "comma-separated items", func(items []string) error { got = items; return nil })
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("items %q, want %q", got, tc.want)
			}
		})
	}
}

func TestValidateBindAddress(t *testing.T) {
	for _, tc := range []struct {
		addr    string
		wantErr string
	}{
		{addr: "0"},
		{addr: ":8080"},
		{addr: "127.0.0.1:0"},
		{addr: "[::1]:8081"},
		{addr: "", wantErr: `--metrics-bind-address="": missing port in address; use host:port or :port, e.g. :8080, or 0 to disable`},
		{addr: "8080", wantErr: "missing port in address"},
		{addr: ":metrics", wantErr: `port "metrics" is not a number in 0..65535`},
		{addr: ":70000", wantErr: `port "70000" is not a number`},
	} {
		t.Run(tc.addr, func(t *testing.T) {
			err := ValidateBindAddress("--metrics-bind-address", tc.addr)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want %q", err, tc.wantErr)
			}
		})
	}
}
