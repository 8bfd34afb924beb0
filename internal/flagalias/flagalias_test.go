package flagalias

import (
	"flag"
	"io"
	"strings"
	"testing"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
)

func TestDeprecated(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		wantFile string
		wantPoll time.Duration
		wantLogs int
		wantErr  bool
	}{
		{name: "defaults", wantPoll: 10 * time.Second},
		{name: "new names", args: []string{"--file=/a", "--poll=1s"}, wantFile: "/a", wantPoll: time.Second},
		{name: "old names", args: []string{"--old-file=/a", "--old-poll=2s"}, wantFile: "/a", wantPoll: 2 * time.Second, wantLogs: 2},
		{name: "last one wins", args: []string{"--file=/a", "--old-file=/b"}, wantFile: "/b", wantPoll: 10 * time.Second, wantLogs: 1},
		{name: "invalid value through the old name", args: []string{"--old-poll=soon"}, wantLogs: 1, wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			logger, buffer := bufferedLogger(t)
			klog.SetLogger(logger)
			defer klog.ClearLogger()

			var file string
			var poll time.Duration
			fs := flag.NewFlagSet("test", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			fs.StringVar(&file, "file", "", "")
			fs.DurationVar(&poll, "poll", 10*time.Second, "")
			Deprecated(fs, "old-file", "file")
			Deprecated(fs, "old-poll", "poll")
			err := fs.Parse(tc.args)
			if (err != nil) != tc.wantErr {
				t.Fatalf("Parse: %v, want error %v", err, tc.wantErr)
			}
			if err != nil && !strings.Contains(err.Error(), "-old-poll") {
				t.Errorf("error %q does not name the flag given", err)
			}
			if !tc.wantErr && (file != tc.wantFile || poll != tc.wantPoll) {
				t.Errorf("file %q, poll %v; want %q, %v", file, poll, tc.wantFile, tc.wantPoll)
			}
			logs := buffer.String()
			if got := strings.Count(logs, "Flag is deprecated; use its new name"); got != tc.wantLogs {
				t.Errorf("%d deprecation lines, want %d:\n%s", got, tc.wantLogs, logs)
			}
			if tc.wantLogs > 0 && !strings.Contains(logs, `flag="--old-file"`) && !strings.Contains(logs, `flag="--old-poll"`) {
				t.Errorf("deprecation line does not name the old flag:\n%s", logs)
			}
		})
	}
}

func TestHelpShowsNewName(t *testing.T) {
	var file string
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	var out strings.Builder
	fs.SetOutput(&out)
	fs.StringVar(&file, "file", "", "the file")
	Deprecated(fs, "old-file", "file")
	fs.PrintDefaults()
	if !strings.Contains(out.String(), "Deprecated: use --file.") {
		t.Errorf("help:\n%s", out.String())
	}
}

func bufferedLogger(t *testing.T) (klog.Logger, interface{ String() string }) {
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	return logger, logger.GetSink().(ktesting.Underlier).GetBuffer()
}

func TestRetired(t *testing.T) {
	logger, buffer := bufferedLogger(t)
	klog.SetLogger(logger)
	defer klog.ClearLogger()

	var poll time.Duration
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	var help strings.Builder
	fs.SetOutput(&help)
	fs.DurationVar(&poll, "poll", 10*time.Second, "")
	Retired(fs, "timeout", "nothing is cleaned up any more")
	if err := fs.Parse([]string{"--timeout=20s", "--poll=1s"}); err != nil {
		t.Fatal(err)
	}
	if poll != time.Second {
		t.Errorf("poll %v, want 1s", poll)
	}
	logs := buffer.String()
	if n := strings.Count(logs, "Flag is deprecated and has no effect"); n != 1 || !strings.Contains(logs, `flag="--timeout"`) || !strings.Contains(logs, "nothing is cleaned up any more") {
		t.Errorf("want one line naming the flag and why:\n%s", logs)
	}
	fs.PrintDefaults()
	if !strings.Contains(help.String(), "Deprecated, no effect: nothing is cleaned up any more.") {
		t.Errorf("help:\n%s", help.String())
	}
}
