package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/gowarp/gowarp/cache/cluster"
	"github.com/gowarp/gowarp/internal/etcdtest"
)

var quiet = slog.New(slog.DiscardHandler)

func etcdClient(t testing.TB, endpoint string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// ctxT bounds a test's calls: generously, since a busy machine under the
// race detector is slow; it is there so that a hang fails, not to time.
func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// waitRing waits until the membership's ring has want members (by ID).
func waitRing(t testing.TB, w *cluster.Membership, want ...string) *cluster.Ring {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		ch := w.Changed()
		r := w.Ring()
		if ids(r.Members()) == fmt.Sprint(want) {
			return r
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("members %s, want %v", ids(r.Members()), want)
		}
	}
}

func ids(ms []cluster.Member) string {
	var s []string
	for _, m := range ms {
		s = append(s, m.ID)
	}
	return fmt.Sprint(s)
}

func TestMembershipJoinLeaveExpire(t *testing.T) {
	ep := etcdtest.Start(t)
	ctx := ctxT(t)
	cli := etcdClient(t, ep)
	w, err := cluster.Watch(ctx, cli, "t", cluster.WatchOptions{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if w.Ring().Len() != 0 {
		t.Fatalf("an empty cluster has members %s", ids(w.Ring().Members()))
	}
	var regs []*cluster.Registration
	// Server c has an etcd client of its own, closed to stand for its
	// death: its lease is no longer kept alive and expires.
	cliC := etcdClient(t, ep)
	for i, id := range []string{"a", "b", "c"} {
		c := cli
		if id == "c" {
			c = cliC
		}
		r, err := cluster.Join(ctx, c, "t", cluster.Member{ID: id, Addr: fmt.Sprintf("127.0.0.1:%d", 7000+i)},
			cluster.JoinOptions{TTL: time.Second, Replicas: 2, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		regs = append(regs, r)
	}
	r := waitRing(t, w, "a", "b", "c")
	if r.Replicas() != 2 {
		t.Errorf("replicas %d, want 2", r.Replicas())
	}
	// Another server under a live member's ID is refused.
	if _, err := cluster.Join(ctx, cli, "t", cluster.Member{ID: "a", Addr: "127.0.0.1:9999"}, cluster.JoinOptions{Logger: quiet}); !errors.Is(err, cluster.ErrMemberExists) {
		t.Errorf("join under a live ID: %v, want ErrMemberExists", err)
	}
	// A later joiner keeps the cluster's R.
	w2, err := cluster.Watch(ctx, cli, "t", cluster.WatchOptions{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Close()
	if got := ids(w2.Ring().Members()); got != "[a b c]" {
		t.Errorf("a watcher started later sees %s", got)
	}

	if err := regs[0].Leave(ctx); err != nil {
		t.Fatal(err)
	}
	waitRing(t, w, "b", "c")
	cliC.Close()
	waitRing(t, w, "b")
	waitRing(t, w2, "b")
	if err := regs[1].Leave(ctx); err != nil {
		t.Fatal(err)
	}
	waitRing(t, w, []string{}...)
}

// TestJoinRestart: a server that restarts under its ID and address before
// its old lease expired takes its record over.
func TestJoinRestart(t *testing.T) {
	ep := etcdtest.Start(t)
	ctx := ctxT(t)
	m := cluster.Member{ID: "a", Addr: "127.0.0.1:7000"}
	old := etcdClient(t, ep)
	if _, err := cluster.Join(ctx, old, "t", m, cluster.JoinOptions{TTL: 30 * time.Second, Logger: quiet}); err != nil {
		t.Fatal(err)
	}
	old.Close() // dies; its lease lives on for 30 s
	cli := etcdClient(t, ep)
	r, err := cluster.Join(ctx, cli, "t", m, cluster.JoinOptions{TTL: 30 * time.Second, Logger: quiet})
	if err != nil {
		t.Fatalf("restart under the same ID and address: %v", err)
	}
	w, err := cluster.Watch(ctx, cli, "t", cluster.WatchOptions{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	waitRing(t, w, "a")
	if err := r.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	waitRing(t, w, []string{}...)
}

// TestMembershipHostileRecords: records that do not parse are left out,
// said why, and never stop the others from being seen.
func TestMembershipHostileRecords(t *testing.T) {
	ep := etcdtest.Start(t)
	ctx := ctxT(t)
	cli := etcdClient(t, ep)
	p := cluster.Prefix("t") + "members/"
	bad := map[string]string{
		"junk":     "\x00\xff not json",
		"empty":    "",
		"version":  `{"v":9,"id":"version","addr":"127.0.0.1:1"}`,
		"mismatch": `{"v":1,"id":"other","addr":"127.0.0.1:1"}`,
		"noport":   `{"v":1,"id":"noport","addr":"127.0.0.1"}`,
		"a/b":      `{"v":1,"id":"a/b","addr":"127.0.0.1:1"}`,
		"huge":     `{"v":1,"id":"huge","addr":"127.0.0.1:1","http":"` + string(make([]byte, 5000)) + `"}`,
		"types":    `{"v":"1","id":7,"addr":[]}`,
	}
	for id, v := range bad {
		if _, err := cli.Put(ctx, p+id, v); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cli.Put(ctx, p+"good", `{"v":1,"id":"good","addr":"127.0.0.1:7000"}`); err != nil {
		t.Fatal(err)
	}
	w, err := cluster.Watch(ctx, cli, "t", cluster.WatchOptions{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	waitRing(t, w, "good")
	inv := w.Invalid()
	for id := range bad {
		if !errors.Is(inv[id], cluster.ErrBadMember) {
			t.Errorf("record %q: %v, want ErrBadMember", id, inv[id])
		}
	}
	// The same through the watch, after the start.
	if _, err := cli.Put(ctx, p+"late", "{{{"); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, p+"good2", `{"v":1,"id":"good2","addr":"[::1]:7001"}`); err != nil {
		t.Fatal(err)
	}
	waitRing(t, w, "good", "good2")
	if !errors.Is(w.Invalid()["late"], cluster.ErrBadMember) {
		t.Errorf("late record: %v", w.Invalid()["late"])
	}
	// A bad config after the start is ignored, the last good one kept.
	if _, err := cli.Put(ctx, cluster.Prefix("t")+"config", `{"replicas":3}`); err != nil {
		t.Fatal(err)
	}
	for w.Ring().Replicas() != 3 {
		<-w.Changed()
	}
	if _, err := cli.Put(ctx, cluster.Prefix("t")+"config", `{"replicas":-1}`); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, p+"good3", `{"v":1,"id":"good3","addr":"127.0.0.1:7003"}`); err != nil {
		t.Fatal(err)
	}
	if r := waitRing(t, w, "good", "good2", "good3"); r.Replicas() != 3 {
		t.Errorf("replicas %d after a bad config, want 3 kept", r.Replicas())
	}
	// A bad config at the start is a clear error.
	if _, err := cluster.Watch(ctx, cli, "t", cluster.WatchOptions{Logger: quiet}); !errors.Is(err, cluster.ErrBadConfig) {
		t.Errorf("watch of a cluster with a bad config: %v, want ErrBadConfig", err)
	}
}

// TestWatchUnreachable: with no etcd to answer, Watch ends with the
// context's error, it does not hang.
func TestWatchUnreachable(t *testing.T) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:1"}, DialTimeout: time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if _, err := cluster.Watch(ctx, cli, "t", cluster.WatchOptions{Logger: quiet}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("watch with etcd unreachable: %v, want a deadline error", err)
	}
}
