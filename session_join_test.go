package gowarp_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
)

// TestFailoverRejoinEarlyMessages: the peer may send on a rejoining
// connection as soon as it is up, before the session's goroutine has taken
// the connection in; those messages must not be lost. The server's session
// is held still while the client's only path dies, rejoins, and sends new
// Sends on the new connection; once it runs again, every Send must be
// delivered. (Before the connection was known to its session from the
// start, its goroutine could take the early completions first, find no
// connection for them and drop them: then both sides waited forever, one
// for acknowledgements, the other for the messages.)
func TestFailoverRejoinEarlyMessages(t *testing.T) {
	cfg := gowarp.SessionConfig{HeartbeatInterval: 50 * time.Millisecond, HeartbeatTimeout: 2 * time.Second, Deadline: 20 * time.Second}
	dev := gowarp.Open()
	pd := dev.AllocPD()
	ln, err := dev.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sl := pd.ListenSession(cfg, ln)
	defer sl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cli, err := pd.DialSession(ctx, []string{ln.Addr().String()}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	srv, err := sl.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	src, _ := pd.Register(make([]byte, 64), gowarp.LocalWrite)
	rbuf, _ := pd.Register(make([]byte, 64*16), gowarp.LocalWrite)
	for i := range 16 {
		if err := srv.PostRecv(&gowarp.RecvWR{ID: uint64(i), SGL: []gowarp.SGE{{MR: rbuf, Offset: 64 * i, Length: 64}}}); err != nil {
			t.Fatal(err)
		}
	}
	var wc [16]gowarp.SessionCompletion
	take := func(s *gowarp.Session, n int, what string) {
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		for got := 0; got < n; {
			if err := s.Wait(wctx); err != nil {
				t.Fatalf("%s: %d of %d completions, then %v", what, got, n, err)
			}
			for _, c := range wc[:s.Poll(wc[:])] {
				if c.Err != nil {
					t.Fatalf("%s: completion %d: %v", what, c.ID, c.Err)
				}
				got++
			}
		}
	}
	id := uint64(0)
	for round := range 12 {
		hold := gowarp.StallSession(srv)
		gowarp.CloseSessionPath(cli, 0)
		for range 4 { // queued until the path rejoins, then sent on it at once
			if err := cli.PostSend(&gowarp.SendWR{ID: id, Op: gowarp.OpSend, Flags: gowarp.Signaled, SGL: []gowarp.SGE{{MR: src, Length: 64}}}); err != nil {
				hold()
				t.Fatal(err)
			}
			id++
		}
		time.Sleep(200 * time.Millisecond) // the rejoin and the Sends, while the server's goroutine stands still
		hold()
		take(cli, 4, fmt.Sprint("round ", round, ": the client's Sends"))
		take(srv, 4, "server's receives")
		for i := range 4 {
			if err := srv.PostRecv(&gowarp.RecvWR{ID: uint64(i), SGL: []gowarp.SGE{{MR: rbuf, Offset: 64 * i, Length: 64}}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// One fail-over and one rejoin a round, the cut's: a message lost on
	// the way in costs the connection (out of order) and another of each.
	if st := cli.Stats(); st.Joins != 12 || st.Failovers != 12 {
		t.Fatalf("%d rejoins and %d fail-overs in 12 rounds, want 12 of each", st.Joins, st.Failovers)
	}
}
