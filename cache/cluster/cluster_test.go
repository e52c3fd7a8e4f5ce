package cluster_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/gowarp/gowarp"
	"github.com/gowarp/gowarp/cache"
	"github.com/gowarp/gowarp/cache/cluster"
	"github.com/gowarp/gowarp/internal/etcdtest"
)

// server is one cache server of a test cluster: registered in etcd
// through an etcd client of its own, so that closing that client stands
// for the process's death (its lease is no longer kept alive).
type server struct {
	id     string
	addr   string
	srv    *cache.Server
	etcd   *clientv3.Client
	reg    *cluster.Registration
	stop   func()
	direct *cache.Client  // see onServer
	gets   *atomic.Uint64 // get requests the server answered

	mu         sync.Mutex
	reconciled cluster.ReconcileStats // what its last Reconcile did
}

func startServer(t *testing.T, ep, id string) *server {
	t.Helper()
	return startServerIn(t, ep, id, t.TempDir())
}

// startServerIn starts server id on the data in dir (a restart, where dir
// held an earlier server's).
func startServerIn(t *testing.T, ep, id, dir string) *server {
	t.Helper()
	gets := new(atomic.Uint64)
	srv, err := cache.NewServer(cache.ServerOptions{Dir: dir, Logger: quiet, Device: gowarp.Open(gowarp.WithLogger(quiet)),
		BlockSize: 1 << 20, Budget: 16 << 20, OnRequest: func(op cache.Op, _ cache.Status, _ int, _ time.Duration) {
			if op == cache.OpGet {
				gets.Add(1)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := srv.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	s := &server{id: id, addr: ln.Addr().String(), srv: srv, etcd: etcdClient(t, ep), gets: gets}
	var once sync.Once
	s.stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("%s: serve: %v", id, err)
			}
			srv.Close()
		})
	}
	t.Cleanup(s.stop)
	// As gowarp cache serve -etcd does: reconcile its keys with the
	// members that stayed before it joins, and repair them after each
	// change of the map.
	cc := newClient(t, ep)
	self := cluster.Member{ID: id, Addr: s.addr}
	prepare := func(ctx context.Context) error {
		st, err := cc.Reconcile(ctx, self)
		s.mu.Lock()
		s.reconciled = st
		s.mu.Unlock()
		return err
	}
	s.reg, err = cluster.Join(ctxT(t), s.etcd, "t", self,
		cluster.JoinOptions{TTL: time.Second, Replicas: 2, Prepare: prepare, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	go cc.RepairOnChange(ctx, id, 100*time.Millisecond)
	return s
}

// kill stops the server at once, as kill -9 does: connections drop, and
// the lease expires in its TTL since nobody keeps it alive.
func (s *server) kill() {
	s.stop()
	s.etcd.Close()
}

func newClient(t *testing.T, ep string) *cluster.Client {
	t.Helper()
	c, err := cluster.NewClient(ctxT(t), etcdClient(t, ep), "t", cluster.ClientOptions{Logger: quiet,
		Cache: cache.ClientOptions{Device: gowarp.Open(gowarp.WithLogger(quiet)), Logger: quiet}, DownFor: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func val(i int) []byte {
	n := 50 + i*37%3000
	if i%10 == 0 {
		n = 40 << 10 // larger than InlineMax: written and read by RDMA
	}
	tag := []byte(fmt.Sprintf("%d.", i))
	return bytes.Repeat(tag, n/len(tag)+1)[:n]
}

func checkAll(t *testing.T, c *cluster.Client, n int, what string) {
	t.Helper()
	ctx := ctxT(t)
	for i := range n {
		got, err := c.Get(ctx, fmt.Sprintf("key-%d", i))
		if err != nil || !bytes.Equal(got, val(i)) {
			t.Fatalf("%s: get key-%d: %d bytes, %v", what, i, len(got), err)
		}
	}
}

// onServer says which servers hold key, asked directly (not through the
// cluster), each through a client of the test's own.
func onServer(t *testing.T, servers []*server, key string) []string {
	t.Helper()
	var ids []string
	for _, s := range servers {
		if s.direct == nil {
			c, err := cache.Dial(ctxT(t), s.addr, cache.ClientOptions{Device: gowarp.Open(gowarp.WithLogger(quiet)), Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			s.direct = c
		}
		if _, err := s.direct.Lookup(ctxT(t), key); err == nil {
			ids = append(ids, s.id)
		} else if !errors.Is(err, cache.ErrNotFound) {
			t.Fatal(err)
		}
	}
	return ids
}

// startCluster starts etcd and three servers a, b and c, and puts n keys
// (key-0 ...) through a cluster client.
func startCluster(t *testing.T, n int) (ep string, servers []*server, c *cluster.Client) {
	t.Helper()
	ep = etcdtest.Start(t)
	for _, id := range []string{"a", "b", "c"} {
		servers = append(servers, startServer(t, ep, id))
	}
	c = newClient(t, ep)
	waitRing(t, c.Membership(), "a", "b", "c")
	ctx := ctxT(t)
	for i := range n {
		if err := c.Put(ctx, fmt.Sprintf("key-%d", i), val(i), cache.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return ep, servers, c
}

// TestClusterServerRemoved: three servers, R = 2. Keys put through the
// cluster are on their two owners. One server is killed (or leaves):
// every key is still served, at once and after the map has changed; the
// survivors' Repair gives every key two copies again; and a client
// started after the change finds the new map and every key.
func TestClusterServerRemoved(t *testing.T) {
	for _, how := range []string{"kill", "leave"} {
		t.Run(how, func(t *testing.T) {
			const n = 60
			ep, servers, c := startCluster(t, n)
			ctx := ctxT(t)
			// Each key is on its two owners (once the servers' repairs
			// after their joins are done: a server that repaired while it
			// had not yet seen every join may have copied a key to a
			// server that does not own it, which that server then drops).
			ring := c.Ring()
			deadline := time.Now().Add(20 * time.Second)
			for i := 0; i < n; i++ {
				key := fmt.Sprintf("key-%d", i)
				owners := ring.Owners(nil, key)
				slices.SortFunc(owners, func(a, b cluster.Member) int { return strings.Compare(a.ID, b.ID) })
				if got, want := onServer(t, servers, key), ids(owners); fmt.Sprint(got) != want {
					if time.Now().After(deadline) {
						t.Fatalf("%s is on %v, its owners are %s", key, got, want)
					}
					time.Sleep(20 * time.Millisecond)
					i--
				}
			}

			gone := servers[1]
			if how == "kill" {
				gone.kill()
				// Served at once, before etcd has noticed: from the other
				// owner of each key.
				checkAll(t, c, n, "b killed, still in the map")
			} else {
				if err := gone.reg.Leave(ctx); err != nil {
					t.Fatal(err)
				}
				gone.stop()
			}
			waitRing(t, c.Membership(), "a", "c")
			checkAll(t, c, n, "b gone from the map")

			// The survivors copy the keys that lost a copy to their new
			// owners by themselves: every key gets back to two copies.
			survivors := []*server{servers[0], servers[2]}
			deadline = time.Now().Add(20 * time.Second)
			for i := 0; i < n; i++ {
				key := fmt.Sprintf("key-%d", i)
				if got := onServer(t, survivors, key); len(got) != 2 {
					if time.Now().After(deadline) {
						t.Fatalf("%s is on %v, want both survivors", key, got)
					}
					time.Sleep(20 * time.Millisecond)
					i--
				}
			}
			// A sweep now finds nothing to do.
			if st, err := c.Repair(ctx); err != nil || st.Copied != 0 || st.Keys != 2*n {
				t.Fatalf("repair after the survivors': %+v, %v; want %d keys, none to copy", st, err, 2*n)
			}

			late := newClient(t, ep)
			if got := ids(late.Ring().Members()); got != "[a c]" {
				t.Fatalf("a client started after the change sees %s", got)
			}
			checkAll(t, late, n, "a new client")
			if err := late.Delete(ctx, "key-1"); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Get(ctx, "key-1"); !errors.Is(err, cache.ErrNotFound) {
				t.Fatalf("get after delete: %v, want ErrNotFound", err)
			}
		})
	}
}

// TestClusterServerVanishesMidRequest: gets run while a server is killed
// under them; each ends with the right value (from the other owner),
// none hangs or fails.
func TestClusterServerVanishesMidRequest(t *testing.T) {
	const n = 40
	_, servers, c := startCluster(t, n)
	ctx := ctxT(t)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	started := make(chan struct{}, 4)
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			started <- struct{}{}
			for round := range 5 {
				for i := g; i < n; i += 4 {
					got, err := c.Get(ctx, fmt.Sprintf("key-%d", i))
					if err != nil || !bytes.Equal(got, val(i)) {
						errs <- fmt.Errorf("round %d: get key-%d: %d bytes, %w", round, i, len(got), err)
						return
					}
				}
			}
		}()
	}
	for range 4 {
		<-started
	}
	servers[0].kill()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestClusterBadMembers: a member record that does not parse, and one
// that parses but names an address where nobody serves: every key is
// still stored and served by the servers that are there.
func TestClusterBadMembers(t *testing.T) {
	ep := etcdtest.Start(t)
	startServer(t, ep, "a")
	startServer(t, ep, "b")
	cli := etcdClient(t, ep)
	ctx := ctxT(t)
	p := cluster.Prefix("t") + "members/"
	if _, err := cli.Put(ctx, p+"junk", "\x00 not a record"); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, p+"ghost", `{"v":1,"id":"ghost","addr":"127.0.0.1:1"}`); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, ep)
	waitRing(t, c.Membership(), "a", "b", "ghost")
	const n = 40
	for i := range n {
		if err := c.Put(ctx, fmt.Sprintf("key-%d", i), val(i), cache.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	checkAll(t, c, n, "with a ghost member")
	// All owners unreachable: a clear error, not a hang.
	if _, err := cli.Delete(ctx, p, clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, p+"ghost", `{"v":1,"id":"ghost","addr":"127.0.0.1:1"}`); err != nil {
		t.Fatal(err)
	}
	waitRing(t, c.Membership(), "ghost")
	if _, err := c.Get(ctx, "key-1"); !errors.Is(err, cluster.ErrUnavailable) {
		t.Errorf("get with no owner up: %v, want ErrUnavailable", err)
	}
	if err := c.Put(ctx, "key-1", []byte("x"), cache.PutOptions{}); !errors.Is(err, cluster.ErrUnavailable) {
		t.Errorf("put with no owner up: %v, want ErrUnavailable", err)
	}
	if _, err := cli.Delete(ctx, p, clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	waitRing(t, c.Membership(), []string{}...)
	if _, err := c.Get(ctx, "key-1"); !errors.Is(err, cluster.ErrNoMembers) {
		t.Errorf("get with no members: %v, want ErrNoMembers", err)
	}
}

// TestClusterRejoinStale: a server that was away comes back with the keys
// it had. While it was away one of them was put again and another
// deleted; both have it as their first owner, so its copies are the ones
// every Get would return. It reconciles before it joins: the Get returns
// the new value, the deleted key stays deleted, and a key nobody changed
// is served as it was.
func TestClusterRejoinStale(t *testing.T) {
	const n = 60
	ep, servers, c := startCluster(t, n)
	ctx := ctxT(t)
	a := servers[0]
	ring := c.Ring()
	var firstOnA []string
	for i := range n {
		key := fmt.Sprintf("key-%d", i)
		if ring.Owners(nil, key)[0].ID == "a" {
			firstOnA = append(firstOnA, key)
		}
	}
	if len(firstOnA) < 3 {
		t.Fatalf("only %d of %d keys have a as first owner", len(firstOnA), n)
	}
	changed, deleted, kept := firstOnA[0], firstOnA[1], firstOnA[2]
	// Every key on its owners first (the joins' repairs may still run).
	waitOn(t, servers, changed, "a")
	waitOn(t, servers, deleted, "a")

	dir := a.srv.Dir()
	a.kill()
	waitRing(t, c.Membership(), "b", "c")
	newer := []byte("put while a was away")
	if err := c.Put(ctx, changed, newer, cache.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, deleted); err != nil {
		t.Fatal(err)
	}

	back := startServerIn(t, ep, "a", dir)
	waitRing(t, c.Membership(), "a", "b", "c")
	back.mu.Lock()
	st := back.reconciled
	back.mu.Unlock()
	if st.Keys == 0 || st.Refreshed == 0 || st.Dropped == 0 {
		t.Errorf("reconcile on rejoin: %+v; want keys refreshed and dropped", st)
	}
	if got, err := c.Get(ctx, changed); err != nil || !bytes.Equal(got, newer) {
		t.Errorf("get %s after a's return: %.40q, %v; want %q", changed, got, err, newer)
	}
	if got, err := c.Get(ctx, deleted); !errors.Is(err, cache.ErrNotFound) {
		t.Errorf("get %s, deleted while a was away: %d bytes, %v; want ErrNotFound", deleted, len(got), err)
	}
	var i int
	fmt.Sscanf(kept, "key-%d", &i)
	if got, err := c.Get(ctx, kept); err != nil || !bytes.Equal(got, val(i)) {
		t.Errorf("get %s, unchanged: %d bytes, %v", kept, len(got), err)
	}
	servers[0] = back
	if on := onServer(t, servers, deleted); len(on) != 0 {
		t.Errorf("%s, deleted, is still on %v", deleted, on)
	}
}

// waitOn waits until key is on server id.
func waitOn(t *testing.T, servers []*server, key, id string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !slices.Contains(onServer(t, servers, key), id) {
		if time.Now().After(deadline) {
			t.Fatalf("%s never reached %s", key, id)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestClusterRejoinUnverified: a server comes back while another member
// is registered but unreachable (its cache server stopped, its lease kept
// alive). A key deleted while it was away cannot be shown to be gone:
// the unreachable member could still hold it. Reconcile must keep it
// (a later Repair or Reconcile decides), not delete it on the word of the
// members that answered; a key another member holds is still refreshed.
func TestClusterRejoinUnverified(t *testing.T) {
	const n = 60
	ep, servers, c := startCluster(t, n)
	ctx := ctxT(t)
	a, b := servers[0], servers[1]
	ring := c.Ring()
	var onA []string
	for i := range n {
		key := fmt.Sprintf("key-%d", i)
		if isOwner(ring, key, "a") {
			onA = append(onA, key)
		}
	}
	if len(onA) < 2 {
		t.Fatalf("only %d of %d keys are on a", len(onA), n)
	}
	deleted, changed := onA[0], onA[1]
	waitOn(t, servers, deleted, "a")
	waitOn(t, servers, changed, "a")

	dir := a.srv.Dir()
	a.kill()
	waitRing(t, c.Membership(), "b", "c")
	if err := c.Delete(ctx, deleted); err != nil {
		t.Fatal(err)
	}
	newer := []byte("put while a was away")
	if err := c.Put(ctx, changed, newer, cache.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	// b stays a member but answers nobody.
	b.stop()

	back := startServerIn(t, ep, "a", dir)
	waitRing(t, c.Membership(), "a", "b", "c")
	back.mu.Lock()
	st := back.reconciled
	back.mu.Unlock()
	// Every key has b among the members asked (there are only b and c),
	// so no key can be shown to be gone.
	if st.Keys == 0 || st.Unverified == 0 || st.Dropped != 0 || st.Refreshed == 0 {
		t.Errorf("reconcile with b unreachable: %+v; want keys unverified and refreshed, none dropped", st)
	}
	direct, err := cache.Dial(ctx, back.addr, cache.ClientOptions{Device: gowarp.Open(gowarp.WithLogger(quiet)), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	if _, err := direct.Lookup(ctx, deleted); err != nil {
		t.Errorf("%s, whose deletion b could not confirm, is gone from a: %v", deleted, err)
	}
	if got, err := direct.Get(ctx, changed); err != nil || !bytes.Equal(got, newer) {
		t.Errorf("%s on a: %.40q, %v; want c's copy %q", changed, got, err, newer)
	}
}

func isOwner(r *cluster.Ring, key, id string) bool {
	for _, o := range r.Owners(nil, key) {
		if o.ID == id {
			return true
		}
	}
	return false
}

// TestReconcileFetches: Reconcile compares its copies with the other
// members' by size and sum before it fetches anything. Run for a, a
// member whose keys all equal their other owners', it fetches nothing
// (no get reaches b or c); after a's copy of one key is overwritten with
// other bytes of the same size, it fetches that one key (one get) and
// puts the other members' copy back on a.
func TestReconcileFetches(t *testing.T) {
	const n = 60
	_, servers, c := startCluster(t, n)
	ctx := ctxT(t)
	ring := c.Ring()
	// Quiet first: every key on exactly its owners (the joins' repairs
	// done), so no repair gets a value while the gets are counted.
	settled := func() bool {
		for i := range n {
			key := fmt.Sprintf("key-%d", i)
			owners := ring.Owners(nil, key)
			slices.SortFunc(owners, func(a, b cluster.Member) int { return strings.Compare(a.ID, b.ID) })
			if fmt.Sprint(onServer(t, servers, key)) != ids(owners) {
				return false
			}
		}
		return true
	}
	deadline := time.Now().Add(20 * time.Second)
	for !settled() {
		if time.Now().After(deadline) {
			t.Fatal("keys never settled on their owners")
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond) // a repair already running ends
	a, b, cc := servers[0], servers[1], servers[2]
	self := cluster.Member{ID: "a", Addr: a.addr}
	others := func() uint64 { return b.gets.Load() + cc.gets.Load() }

	before := others()
	st, err := c.Reconcile(ctx, self)
	if err != nil {
		t.Fatal(err)
	}
	if got := others() - before; got != 0 || st.Fetched != 0 || st.Keys == 0 || st.Unchanged != st.Keys || st.Refreshed != 0 {
		t.Errorf("reconcile of equal copies: %+v, %d gets on b and c; want every key unchanged, nothing fetched", st, got)
	}

	var key string
	var i int
	for i = range n {
		if key = fmt.Sprintf("key-%d", i); isOwner(ring, key, "a") {
			break
		}
	}
	other := bytes.Clone(val(i))
	other[0] ^= 0xff // the same size: only the sum tells
	if err := a.direct.Put(ctx, key, other, cache.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	before = others()
	st, err = c.Reconcile(ctx, self)
	if err != nil {
		t.Fatal(err)
	}
	if got := others() - before; got != 1 || st.Fetched != 1 || st.Refreshed != 1 || st.Unchanged != st.Keys-1 {
		t.Errorf("reconcile after %s changed on a: %+v, %d gets on b and c; want one fetched and refreshed", key, st, got)
	}
	if got, err := a.direct.Get(ctx, key); err != nil || !bytes.Equal(got, val(i)) {
		t.Errorf("%s on a after reconcile: %d bytes, %v; want the other members' copy", key, len(got), err)
	}
}
