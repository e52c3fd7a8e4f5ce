package testwatch

import (
	"bytes"
	"runtime"
	"strings"
	"testing"
)

// TestSummaryNamesTests: a goroutine parked in a test's function shows in
// the summary with the test's file and line; one without test code does
// not.
func TestSummaryNamesTests(t *testing.T) {
	block := make(chan struct{})
	defer close(block)
	started := make(chan struct{})
	go parkedHere(started, block)
	<-started
	go func() { <-block }() // in this file too: shows
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	s := Summary(buf)
	if !strings.Contains(s, "testwatch.parkedHere") || !strings.Contains(s, "testwatch_test.go:") {
		t.Fatalf("summary without the parked test goroutine:\n%s", s)
	}
	if !strings.Contains(s, "TestSummaryNamesTests") {
		t.Fatalf("summary without the test itself:\n%s", s)
	}
	if strings.Contains(s, "runtime.gcBgMarkWorker") || strings.Contains(s, "bgsweep") {
		t.Fatalf("summary with the runtime's goroutines:\n%s", s)
	}
	var out bytes.Buffer
	Dump(&out, "now")
	d := out.String()
	i := strings.LastIndex(d, "testwatch: now; the goroutines in tests:\n")
	if i < 0 || !strings.Contains(d[:i], "goroutine ") || !strings.Contains(d[i:], "testwatch.parkedHere") {
		t.Fatalf("the dump does not end with the summary:\n%s", d)
	}
}

func parkedHere(started, block chan struct{}) {
	close(started)
	<-block
}
