//go:build linux

package gowarp_test

import (
	"testing"
	"time"

	"github.com/gowarp/gowarp"
)

// TestFailoverBothPathsStalled: one side's session goroutine is held
// still for longer than the heartbeat timeout, as a loaded host may hold
// it, in the middle of streams both ways: the other side finds both paths
// dead at once and ends them, and the session must come back on new
// connections of both (the client dials them again) and carry every
// message on, once and in order. The server is held still, then the
// client, three times each.
func TestFailoverBothPathsStalled(t *testing.T) {
	sn := newSessNet(t, 2, testSessionConfig())
	const count, size = 24000, 512
	dstS, _ := sn.spd.Register(make([]byte, count*8), gowarp.RemoteWrite|gowarp.RemoteRead)
	dstC, _ := sn.cpd.Register(make([]byte, count/4*8), gowarp.RemoteWrite|gowarp.RemoteRead)
	up := &stream{s: sn.cli, count: count, size: size, depth: 64, dst: dstS, peerCount: count / 4, rate: count / 8}
	down := &stream{s: sn.srv, count: count / 4, size: size, depth: 32, dst: dstC, peerCount: count, rate: count / 32}
	errc := make(chan error, 2)
	go func() { errc <- up.run(sn.cpd) }()
	go func() { errc <- down.run(sn.spd) }()
	for i := range 6 {
		target := up.progress() + 200
		waitFor(t, "progress before a stall", func() bool { return up.progress() >= target || up.progress() == count })
		if up.progress() == count {
			t.Fatalf("the streams ended after %d of 6 stalls: make them longer", i)
		}
		held := sn.srv
		if i%2 == 1 {
			held = sn.cli
		}
		joins := sn.cli.Stats().Joins
		release := gowarp.StallSession(held)
		time.Sleep(1200 * time.Millisecond) // over twice the heartbeat timeout
		release()
		waitFor(t, "both paths back", func() bool {
			return sn.cli.Stats().Joins >= joins+2 && sn.cli.Stats().Conns == 2 && sn.srv.Stats().Conns == 2
		})
	}
	for range 2 {
		select {
		case err := <-errc:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(2 * time.Minute):
			t.Fatalf("streams not done 2 minutes after the last stall: client %s; server %s", gowarp.DebugSession(sn.cli), gowarp.DebugSession(sn.srv))
		}
	}
	if up.sends+up.wrs+up.reads != count || down.recvd != count/2 || up.recvd != count/8 {
		t.Fatalf("completions: client %d of %d, server received %d of %d, client received %d of %d",
			up.sends+up.wrs+up.reads, count, down.recvd, count/2, up.recvd, count/8)
	}
	t.Logf("client %+v; server %+v", sn.cli.Stats(), sn.srv.Stats())
}
