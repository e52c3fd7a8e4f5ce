package siwtest

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
	"github.com/gowarp/gowarp/internal/rping"
)

// siwReachesDetached: siw's rping server, reading a gowarp client's start
// buffer and writing back into its sink buffer, is given regions that
// gowarp detached (MR.Detach) or STags it retired (MR.Retire) between
// pings. siw's Reads and Writes through them must complete, with no
// Terminate either way; the client's memory must not change under them;
// and the pings through live regions before and after must still carry
// their bytes. This is what the cache (retired keys of reused blocks) and
// the RPC client (detached spans of a call given up on) rely on when
// their peer is not gowarp.
func (s *suite) siwReachesDetached(t *testing.T) {
	ctx := ctxFor(t, 2*time.Minute)
	var detail string
	defer func() { s.sum.add(t, t.Name(), detail) }()
	terms := s.terminates(ctx)
	qp, pd, cq, job := s.connectToGuestRping(ctx, t)
	const size = 64 // the guest server's -S
	acc := gowarp.LocalWrite | gowarp.RemoteRead | gowarp.RemoteWrite
	reg := func() *gowarp.MR {
		mr, err := pd.Register(make([]byte, size), acc)
		if err != nil {
			t.Fatal(err)
		}
		return mr
	}
	sendBuf, recvBuf := reg(), reg()
	postRecv := func() {
		if err := qp.PostRecv(&gowarp.RecvWR{ID: 2, SGL: []gowarp.SGE{{MR: recvBuf, Length: size}}}); err != nil {
			t.Fatal(err)
		}
	}
	// early counts the completions that came before they were waited
	// for: siw's go-ahead can complete the receive before the Send's own
	// completion is pushed, when the goroutine that wrote the Send loses
	// its CPU in between (a fresh-clone CI run discarded it so and then
	// waited for it in vain).
	early := map[gowarp.CompletionOp]int{}
	wait := func(op gowarp.CompletionOp) {
		t.Helper()
		var wc [1]gowarp.Completion
		for early[op] == 0 {
			if cq.Poll(wc[:]) == 0 {
				if err := cq.Wait(ctx); err != nil {
					t.Fatalf("waiting for %v: %v (queue pair: %v)", op, err, qp.Err())
				}
				continue
			}
			if wc[0].Status != gowarp.Success {
				t.Fatalf("completion %+v (queue pair: %v)", wc[0], qp.Err())
			}
			early[wc[0].Op]++
		}
		early[op]--
	}
	// One rping exchange: advertise src, siw Reads it; advertise dst, siw
	// Writes what it read into it.
	ping := func(src, dst gowarp.STag, srcAddr, dstAddr uint64) {
		t.Helper()
		for _, i := range []rping.Info{{Buf: srcAddr, RKey: uint32(src), Size: size}, {Buf: dstAddr, RKey: uint32(dst), Size: size}} {
			copy(sendBuf.Bytes(), i.Append(nil))
			postRecv()
			if err := qp.PostSend(&gowarp.SendWR{ID: 1, Op: gowarp.OpSend, Flags: gowarp.Signaled,
				SGL: []gowarp.SGE{{MR: sendBuf, Length: rping.InfoLen}}}); err != nil {
				t.Fatal(err)
			}
			wait(gowarp.CompSend)
			wait(gowarp.CompRecv) // siw's go-ahead, after its Read or Write completed
		}
	}
	live := func(n int) {
		t.Helper()
		start, sink := reg(), reg()
		defer start.Deregister()
		defer sink.Deregister()
		rping.FillPing(start.Bytes(), n)
		ping(start.STag(), sink.STag(), start.Addr(), sink.Addr())
		want := rping.CString(start.Bytes())
		if got := sink.Bytes()[:len(want)]; !bytes.Equal(got, want) {
			t.Fatalf("ping %d through live regions: siw wrote %q, want %q", n, got, want)
		}
	}
	// untouched pings through src and dst (whose keys reach the sink) and
	// checks that neither region's memory changed.
	untouched := func(what string, start, sink *gowarp.MR, src, dst gowarp.STag) {
		t.Helper()
		before := bytes.Clone(start.Bytes())
		ping(src, dst, start.Addr(), sink.Addr())
		if !bytes.Equal(start.Bytes(), before) {
			t.Errorf("%s: the start buffer changed", what)
		}
		if !bytes.Equal(sink.Bytes(), bytes.Repeat([]byte{0xee}, size)) {
			t.Errorf("%s: siw's Write reached the sink buffer's memory: %q", what, sink.Bytes())
		}
	}
	fill := func() (*gowarp.MR, *gowarp.MR) {
		start, sink := reg(), reg()
		rping.FillPing(start.Bytes(), 99)
		copy(sink.Bytes(), bytes.Repeat([]byte{0xee}, size))
		return start, sink
	}
	const rounds = 5
	for r := range rounds {
		live(3 * r)
		start, sink := fill()
		for _, mr := range []*gowarp.MR{start, sink} {
			if err := mr.Detach(ctx); err != nil {
				t.Fatal(err)
			}
		}
		untouched("detached regions", start, sink, start.STag(), sink.STag())
		start.Deregister()
		sink.Deregister()

		live(3*r + 1)
		start, sink = fill()
		var keys [2]gowarp.STag
		for i, mr := range []*gowarp.MR{start, sink} {
			k, err := mr.Expose(gowarp.Plain)
			if err != nil {
				t.Fatal(err)
			}
			if err := mr.Retire(k); err != nil {
				t.Fatal(err)
			}
			keys[i] = k
		}
		untouched("retired keys", start, sink, keys[0], keys[1])
		start.Deregister()
		sink.Deregister()
	}
	live(3 * rounds)
	if err := qp.Err(); err != nil {
		t.Errorf("queue pair: %v", err)
	}
	qp.Close()
	rc, gout, _ := job.wait(ctx)
	if strings.Contains(strings.ToLower(gout), "error") || strings.Contains(gout, "fail") {
		t.Errorf("guest rping -s (rc %d) reported: %s", rc, strings.TrimSpace(gout))
	}
	if n := s.terminates(ctx) - terms; n != 0 {
		t.Errorf("siw logged %d Terminates", n)
	}
	if t.Failed() {
		return
	}
	detail = fmt.Sprintf("%d pings through detached regions and %d through retired keys completed with no Terminate, memory untouched; %d live pings around them carried their bytes; rping -s exited %d", rounds, rounds, 2*rounds+1, rc)
}

// terminates is how many Terminates siw has logged since the guest booted.
func (s *suite) terminates(ctx context.Context) int {
	_, out, _ := s.v.run(ctx, "dmesg | grep -c 'got TERMINATE'", 30*time.Second)
	n, _ := strconv.Atoi(strings.TrimSpace(out))
	return n
}
