package engine

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/gowarp/gowarp/internal/mem"
)

// TestProgressFuncSeesHalfClose: a loop that answers each Write sees the
// peer's FIN that came with its last Write, and ends. Reading the last
// bytes takes the FIN with them and returns short; a reader that took a
// short read for an emptied socket and waited for the next bytes waited
// forever (a vanished client held a server's session so). TCP_INQ tells
// the two apart. The peer half-closes, so no reset answers the loop's
// own Write (which a reset would fail).
func TestProgressFuncSeesHalfClose(t *testing.T) {
	for i := range 20 {
		r := tcpRig(t)
		dst, _ := r.reg(t, 8, mem.LocalWrite|mem.RemoteWrite)
		back, _ := r.reg(t, 8, mem.LocalWrite|mem.RemoteWrite)
		src, _ := r.reg(t, 8, mem.LocalWrite)
		errc := make(chan error, 1)
		go func() {
			var seen uint64
			answer := SendWR{Op: OpWrite, SGL: []SGE{{MR: src, Length: 8}}, RemoteAddr: back.Addr(), RKey: uint32(back.STag())}
			errc <- r.a.ProgressFunc(context.Background(), func() bool {
				if p := dst.Placed(); p > seen {
					seen = p
					return r.a.PostSend(&answer) == nil
				}
				return true
			})
		}()
		for !r.a.rxInline.Load() { // the loop holds the path
			time.Sleep(time.Millisecond)
		}
		if err := r.b.PostSend(&SendWR{Op: OpWrite, SGL: []SGE{{MR: src, Length: 8}}, RemoteAddr: dst.Addr(), RKey: uint32(dst.STag())}); err != nil {
			t.Fatal(err)
		}
		r.b.link.Conn().(*net.TCPConn).CloseWrite()
		select {
		case err := <-errc:
			if err == nil {
				t.Fatalf("round %d: the peer's FIN ended the loop with no error", i)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("round %d: the peer's FIN came with its last Write, and the loop went on waiting", i)
		}
	}
}

// TestProgressFuncPingPong: two queue pairs ping-pong 8-byte Writes, each
// posting from its ProgressFunc's function: every Write lands in turn,
// and the readers, waiting between messages without returning, find the
// socket empty far less than once per message (once each with Progress).
func TestProgressFuncPingPong(t *testing.T) {
	r := tcpRig(t)
	const rounds = 500
	// Each side Writes from its out region into the peer's in region.
	type side struct {
		in, out   *mem.Region
		got, sent []byte
	}
	var sides [2]side
	for i := range sides {
		sides[i].in, sides[i].got = r.reg(t, 8, mem.LocalWrite|mem.RemoteWrite)
		sides[i].out, sides[i].sent = r.reg(t, 8, mem.LocalWrite)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// base: the bytes earlier ping-pongs placed in each region.
	play := func(q *QP, me, peer *side, first bool, rounds int, base uint64) error {
		mine, data := me.in, me.got
		want := base
		sent := 0
		wr := SendWR{Op: OpWrite, SGL: []SGE{{MR: me.out, Length: 8}}, RemoteAddr: peer.in.Addr(), RKey: uint32(peer.in.STag())}
		var ferr error
		post := func() bool {
			me.sent[0] = byte(sent)
			if ferr = q.PostSend(&wr); ferr != nil {
				return false
			}
			sent++
			return true
		}
		calls := 0
		err := q.ProgressFunc(ctx, func() bool {
			calls++
			if calls == 1 && first {
				return post() // called before any wait
			}
			if mine.Placed() < want+8 {
				return true
			}
			want += 8
			if got, round := data[0], (want-base)/8; got != byte(round-1) {
				ferr = fmt.Errorf("round %d: got %d", round, got)
				return false
			}
			if first && sent == rounds {
				return false // the last answer came
			}
			// The answering side stops with its last answer; the first
			// waits for the answer to its last.
			return post() && (first || sent < rounds)
		})
		if ferr != nil {
			return ferr
		}
		return err
	}
	var base uint64
	pingpong := func(n int) {
		t.Helper()
		errc := make(chan error, 1)
		go func() { errc <- play(r.b, &sides[1], &sides[0], false, n, base) }()
		if err := play(r.a, &sides[0], &sides[1], true, n, base); err != nil {
			t.Fatal(err)
		}
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		base += uint64(8 * n)
	}
	pingpong(50) // the free lists grow to what a round trip takes
	la, lb := r.a.link.(*fdLink), r.b.link.(*fdLink)
	before := la.empties.Load() + lb.empties.Load()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	pingpong(rounds)
	runtime.ReadMemStats(&m1)
	// The loops' closures and the goroutine: nothing per round trip.
	if n := m1.Mallocs - m0.Mallocs; n > rounds/10 {
		t.Errorf("%d allocations in %d round trips", n, rounds)
	} else {
		t.Logf("%d allocations in %d round trips", n, rounds)
	}
	// Waiting per message, each reader finds it empty once a message,
	// 2*rounds in all; here none but when readiness came for bytes
	// already read (1-4 on a quiet host, up to 111 with the CPUs busy;
	// 998 and 999 with the wait per message).
	n := la.empties.Load() + lb.empties.Load() - before
	t.Logf("%d empty reads in %d round trips", n, rounds)
	if n > rounds/2 {
		t.Fatalf("the readers found the socket empty %d times in %d round trips", n, rounds)
	}
}

// TestProgressFuncEnds: ProgressFunc returns nil when its function says
// so, at once if the first call does; the context's error when it is
// done; and the queue pair's error, not a hang, when the peer goes.
func TestProgressFuncEnds(t *testing.T) {
	r := tcpRig(t)
	calls := 0
	if err := r.a.ProgressFunc(context.Background(), func() bool { calls++; return false }); err != nil || calls != 1 {
		t.Fatalf("a function that says no at once: %v after %d calls", err, calls)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := r.a.ProgressFunc(ctx, func() bool { return true }); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("with the context done: %v", err)
	}
	errc := make(chan error, 1)
	go func() { errc <- r.a.ProgressFunc(context.Background(), func() bool { return true }) }()
	time.Sleep(20 * time.Millisecond)
	r.b.Close()
	select {
	case err := <-errc:
		if err == nil {
			t.Fatal("the peer closed, and ProgressFunc returned nil")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the peer closed, and ProgressFunc went on waiting")
	}
}
