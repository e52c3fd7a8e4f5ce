package gowarp_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
)

// levelLog records the level and message of every record a logger gets.
type levelLog struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (l *levelLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *levelLog) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	l.recs = append(l.recs, r)
	l.mu.Unlock()
	return nil
}
func (l *levelLog) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *levelLog) WithGroup(string) slog.Handler      { return l }

func (l *levelLog) warnings() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var w []string
	for _, r := range l.recs {
		if r.Level >= slog.LevelWarn {
			m := r.Message
			r.Attrs(func(a slog.Attr) bool {
				m += " " + a.String()
				return true
			})
			w = append(w, m)
		}
	}
	return w
}

// TestSessionClose: an application that closes its session sees no
// warning logged for it (each client's normal close logged "gowarp session
// failed … session closed" at Warn), and the peer's session ends at once
// with ErrSessionClosed, its receive completing so, rather than failing
// over to no one and timing out (a deadline of 30 s here) with a warning.
func TestSessionClose(t *testing.T) {
	var cliLog, srvLog levelLog
	cfg := testSessionConfig()
	cfg.Deadline = 30 * time.Second
	cfg.Logger = slog.New(&cliLog)
	srvCfg := cfg
	srvCfg.Logger = slog.New(&srvLog)
	cli, srv, pd := loopSessionWith(t, cfg, srvCfg)
	mr, _ := pd.Register(make([]byte, 64), gowarp.LocalWrite)
	if err := srv.PostRecv(&gowarp.RecvWR{ID: 7, SGL: []gowarp.SGE{{MR: mr, Length: 64}}}); err != nil {
		t.Fatal(err)
	}
	cli.Close()
	if err := cli.Err(); !errors.Is(err, gowarp.ErrSessionClosed) {
		t.Fatalf("closed session: Err %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Wait(ctx); err != nil {
		t.Fatalf("the peer's session, waiting for its receive: %v (Err %v)", err, srv.Err())
	}
	var wc [1]gowarp.SessionCompletion
	if n := srv.Poll(wc[:]); n != 1 || wc[0].ID != 7 || !errors.Is(wc[0].Err, gowarp.ErrSessionClosed) {
		t.Fatalf("the peer's receive: %d completions, %+v; want 7 with ErrSessionClosed", n, wc[0])
	}
	if err := srv.Err(); !errors.Is(err, gowarp.ErrSessionClosed) {
		t.Errorf("the peer's session: Err %v, want ErrSessionClosed", err)
	}
	if w := cliLog.warnings(); len(w) > 0 {
		t.Errorf("closing its own session logged warnings: %q", w)
	}
	if w := srvLog.warnings(); len(w) > 0 {
		t.Errorf("the peer's session, closed by its peer, logged warnings: %q", w)
	}
}

// TestSessionCloseAfterPost: the peer's Close is in the CQ, not yet taken,
// when a post of this side's finds the connection ended and drops it. The
// message is handled all the same, and the session ends with
// ErrSessionClosed at once. A connection dropped at once, its completions
// ignored, left the session to wait out its deadline (30 s here).
func TestSessionCloseAfterPost(t *testing.T) {
	cfg := testSessionConfig()
	cli, srv, pd := loopSessionWith(t, cfg, cfg)
	mr, _ := pd.Register(make([]byte, 64), gowarp.LocalWrite)
	release := gowarp.StallSession(srv)
	released := false
	defer func() {
		if !released {
			release()
		}
	}()
	cli.Close()
	for start := time.Now(); !gowarp.SessionPathsDown(srv); time.Sleep(time.Millisecond) {
		if time.Since(start) > 10*time.Second {
			t.Fatal("the peer's connections are still up 10 s after its Close")
		}
	}
	// The post goes on the ended connection, which its failure drops.
	if err := srv.PostSend(&gowarp.SendWR{ID: 1, Op: gowarp.OpSend, SGL: []gowarp.SGE{{MR: mr, Length: 8}}}); err != nil {
		t.Fatalf("post before the session saw its end: %v", err)
	}
	release()
	released = true
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for srv.Err() == nil && ctx.Err() == nil {
		srv.Wait(ctx)
		var wc [4]gowarp.SessionCompletion
		srv.Poll(wc[:])
	}
	if err := srv.Err(); !errors.Is(err, gowarp.ErrSessionClosed) {
		t.Fatalf("the peer's session: Err %v, want ErrSessionClosed within 10 s", err)
	}
}
