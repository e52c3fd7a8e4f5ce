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
			w = append(w, r.Message)
		}
	}
	return w
}

// TestSessionCloseLogsNoWarning: an application that closes its own
// session sees no warning logged for it (each client's normal close
// logged "gowarp session failed … session closed" at Warn); the peer's
// session, which then times out, does warn.
func TestSessionCloseLogsNoWarning(t *testing.T) {
	var cliLog, srvLog levelLog
	cfg := testSessionConfig()
	cfg.Deadline = 500 * time.Millisecond
	cfg.Logger = slog.New(&cliLog)
	srvCfg := cfg
	srvCfg.Logger = slog.New(&srvLog)
	cli, srv := loopSessionCfg(t, cfg, srvCfg)
	cli.Close()
	if err := cli.Err(); !errors.Is(err, gowarp.ErrSessionClosed) {
		t.Fatalf("closed session: Err %v", err)
	}
	if w := cliLog.warnings(); len(w) > 0 {
		t.Errorf("closing its own session logged warnings: %q", w)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for srv.Err() == nil {
		if err := srv.Wait(ctx); err != nil && ctx.Err() != nil {
			t.Fatal("the peer's session did not end")
		}
	}
	if w := srvLog.warnings(); len(w) == 0 {
		t.Errorf("the peer's session ended (%v) with no warning logged", srv.Err())
	}
}
