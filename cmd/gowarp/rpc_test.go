package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/gowarp/gowarp/internal/rpcbench"
)

// TestRPCBench runs a short gowarp rpc bench and checks that every case
// of both systems is reported, with calls made and the bytes moved.
func TestRPCBench(t *testing.T) {
	code, out, errs := runCmd(t, context.Background(), "rpc", "bench", "-duration", "50ms", "-c", "1,4", "-touch", "1,100", "-large", "65536", "-json")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errs)
	}
	seen := map[string]int{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var r rpcbench.Result
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("%q: %v", l, err)
		}
		if r.Calls == 0 || r.Rate <= 0 || r.P50 <= 0 {
			t.Errorf("no calls measured: %+v", r)
		}
		if r.Case == "large" && r.System == "gowarp-rpc" && r.Touch == 1 && r.BytesPerCall > 65536/4 {
			t.Errorf("touching 1%% of 64 KiB moved %.0f bytes per call", r.BytesPerCall)
		}
		seen[r.System+" "+r.Case]++
	}
	for k, want := range map[string]int{"grpc-go small": 2, "gowarp-rpc small": 2, "gowarp-rpc-nonblocking small": 2, "grpc-go large": 2, "gowarp-rpc large": 2} {
		if seen[k] != want {
			t.Errorf("%s: %d results, want %d", k, seen[k], want)
		}
	}
}

// TestRPCBenchBadTouch: a percent above 100 is a usage error (it
// sliced the argument beyond its end and panicked).
func TestRPCBenchBadTouch(t *testing.T) {
	code, _, errs := runCmd(t, context.Background(), "rpc", "bench", "-duration", "50ms", "-c", "1", "-touch", "200", "-large", "65536")
	if code != exitUsage || !strings.Contains(errs, "bad flags") {
		t.Fatalf("-touch 200: exit %d, stderr:\n%s", code, errs)
	}
}

// TestRPCBenchExtraArgs: an argument the command does not take is named
// in one line, not answered with the whole usage.
func TestRPCBenchExtraArgs(t *testing.T) {
	code, _, errs := runCmd(t, context.Background(), "rpc", "bench", "-duration", "50ms", "extra")
	if code != exitUsage || errs != "gowarp rpc bench: unexpected arguments [\"extra\"]\n" {
		t.Fatalf("exit %d, stderr:\n%s", code, errs)
	}
}
