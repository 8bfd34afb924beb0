package server

import (
	"runtime/debug"
	"testing"
)

// TestCollectOftenWhile: the initial lists run with the collector's target lowered, never
// raised (GOGC lower, or off), and GOGC's own is back after them.
func TestCollectOftenWhile(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	for _, tc := range []struct {
		name         string
		gogc, during int
	}{
		{name: "default", gogc: 100, during: startGCPercent},
		{name: "the chart's", gogc: 400, during: startGCPercent},
		{name: "lower already", gogc: 10, during: 10},
		{name: "off", gogc: -1, during: -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			debug.SetGCPercent(tc.gogc)
			during := 0
			collectOftenWhile(func() {
				during = debug.SetGCPercent(tc.gogc)
				debug.SetGCPercent(during)
			})
			if during != tc.during {
				t.Errorf("while the lists come in GOGC is %d, want %d", during, tc.during)
			}
			if after := debug.SetGCPercent(100); after != tc.gogc {
				t.Errorf("after the lists GOGC is %d, want %d back", after, tc.gogc)
			}
		})
	}
}
