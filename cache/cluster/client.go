package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/gowarp/gowarp/cache"
)

// ClientOptions configure a cluster client. Zero values mean the defaults.
type ClientOptions struct {
	// Cache configures the client of each server (its Device is shared).
	Cache cache.ClientOptions
	// CallTimeout bounds one call to one server, so that a server that
	// stops answering without closing its connection costs a call this
	// long, not its whole deadline, before the next owner is tried
	// (default 5 s).
	CallTimeout time.Duration
	// DownFor is how long a server that failed a call is passed over
	// before it is tried again, unless no other owner is left (default
	// 2 s). A server that is gone for good leaves the map when its lease
	// expires.
	DownFor time.Duration
	Logger  *slog.Logger
}

// Client is a client of a cluster: it follows the members in etcd and
// routes each key to its owners. Safe for concurrent use.
type Client struct {
	w     *Membership
	o     ClientOptions
	log   *slog.Logger
	mu    sync.Mutex
	nodes map[string]*node // by member ID
	done  bool
}

// node is one server as the client sees it.
type node struct {
	mu        sync.Mutex // held while dialing
	m         Member
	c         *cache.Client
	downUntil time.Time
}

// NewClient follows cluster name in etcd (through cli) and returns a
// client of its servers. It fails if etcd cannot be read before ctx ends.
func NewClient(ctx context.Context, cli *clientv3.Client, name string, o ClientOptions) (*Client, error) {
	if o.CallTimeout <= 0 {
		o.CallTimeout = 5 * time.Second
	}
	if o.DownFor <= 0 {
		o.DownFor = 2 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Cache.Logger == nil {
		o.Cache.Logger = o.Logger
	}
	w, err := Watch(ctx, cli, name, WatchOptions{Logger: o.Logger})
	if err != nil {
		return nil, err
	}
	c := &Client{w: w, o: o, log: o.Logger, nodes: make(map[string]*node)}
	go c.prune()
	return c, nil
}

// Ring returns the map the client routes by now.
func (c *Client) Ring() *Ring { return c.w.Ring() }

// Membership returns the membership the client follows.
func (c *Client) Membership() *Membership { return c.w }

// Close closes the client's connections and stops following etcd.
func (c *Client) Close() error {
	c.mu.Lock()
	c.done = true
	nodes := c.nodes
	c.nodes = nil
	c.mu.Unlock()
	c.w.Close()
	for _, n := range nodes {
		n.close()
	}
	return nil
}

// prune closes the connections to servers that left the map.
func (c *Client) prune() {
	for {
		select {
		case <-c.w.done:
			return
		case <-c.w.Changed():
		}
		live := map[string]bool{}
		for _, m := range c.w.Ring().Members() {
			live[m.ID] = true
		}
		c.mu.Lock()
		var gone []*node
		for id, n := range c.nodes {
			if !live[id] {
				gone = append(gone, n)
				delete(c.nodes, id)
			}
		}
		c.mu.Unlock()
		for _, n := range gone {
			n.close()
		}
	}
}

func (n *node) close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.c != nil {
		n.c.Close()
		n.c = nil
	}
}

// client returns a connected client of member m, dialing it if needed.
func (c *Client) client(ctx context.Context, m Member) (*cache.Client, *node, error) {
	c.mu.Lock()
	if c.done {
		c.mu.Unlock()
		return nil, nil, cache.ErrClosed
	}
	n := c.nodes[m.ID]
	if n == nil || n.m.Addr != m.Addr {
		if n != nil {
			go n.close()
		}
		n = &node{m: m}
		c.nodes[m.ID] = n
	}
	c.mu.Unlock()
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.c != nil {
		return n.c, n, nil
	}
	cl, err := cache.Dial(ctx, m.Addr, c.o.Cache)
	if err != nil {
		return nil, n, err
	}
	n.c = cl
	return cl, n, nil
}

// markDown passes n over for DownFor and drops its connection, so that
// the next call dials it afresh.
func (c *Client) markDown(n *node, err error) {
	n.mu.Lock()
	first := time.Now().After(n.downUntil)
	n.downUntil = time.Now().Add(c.o.DownFor)
	cl := n.c
	n.c = nil
	n.mu.Unlock()
	if cl != nil {
		cl.Close()
	}
	if first {
		c.log.Info("cluster: server down", "id", n.m.ID, "addr", n.m.Addr, "err", err)
	}
}

func (c *Client) isDown(m Member) bool {
	c.mu.Lock()
	n := c.nodes[m.ID]
	c.mu.Unlock()
	if n == nil {
		return false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return time.Now().Before(n.downUntil)
}

// definitive reports whether err is the server's answer about the
// request (the same from any server), not a failure of the server.
func definitive(err error) bool {
	for _, e := range []error{cache.ErrNotFound, cache.ErrTooLarge, cache.ErrBadRequest, cache.ErrMalformed} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// ErrUnavailable: none of a key's owners could be reached.
var ErrUnavailable = errors.New("cluster: no owner of the key answered")

// call runs f against member m with the call timeout; a failure of the
// server (not an answer, not the caller's context) marks it down.
func (c *Client) call(ctx context.Context, m Member, f func(context.Context, *cache.Client) error) error {
	cctx, cancel := context.WithTimeout(ctx, c.o.CallTimeout)
	defer cancel()
	cl, n, err := c.client(cctx, m)
	if err == nil {
		err = f(cctx, cl)
	}
	if err != nil && !definitive(err) && ctx.Err() == nil && n != nil {
		c.markDown(n, err)
	}
	if err != nil {
		return fmt.Errorf("%s (%s): %w", m.ID, m.Addr, err)
	}
	return nil
}

// ordered returns the members to try for key: its owners and then the
// next in its ranking (where a key may still be after a server joined),
// those marked down last.
func (c *Client) ordered(key string, extra int) ([]Member, int, error) {
	r := c.w.Ring()
	if r.Len() == 0 {
		return nil, 0, ErrNoMembers
	}
	ms := r.Ranked(nil, key, r.Replicas()+extra)
	up, down := ms[:0:0], []Member(nil)
	for _, m := range ms {
		if c.isDown(m) {
			down = append(down, m)
		} else {
			up = append(up, m)
		}
	}
	return append(up, down...), min(r.Replicas(), len(ms)), nil
}

// Put stores value under key on every owner of key that answers, on all
// of them at once; it fails only if none does, or with the servers'
// answer (a value too large, say).
func (c *Client) Put(ctx context.Context, key string, value []byte, o cache.PutOptions) error {
	ms, r, err := c.ordered(key, 0)
	if err != nil {
		return err
	}
	var errs [MaxReplicas]error
	put := func(i int) {
		errs[i] = c.call(ctx, ms[i], func(ctx context.Context, cl *cache.Client) error { return cl.Put(ctx, key, value, o) })
	}
	// The owners after the first in goroutines of their own, the first in
	// this one: a put costs one round trip, not R.
	var wg sync.WaitGroup
	for i := 1; i < r; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); put(i) }()
	}
	put(0)
	wg.Wait()
	stored := 0
	var failed []error
	for _, err := range errs[:r] {
		switch {
		case err == nil:
			stored++
		case definitive(err):
			return err
		default:
			failed = append(failed, err)
		}
	}
	if err := ctx.Err(); err != nil && stored < r {
		return err
	}
	if stored == 0 {
		return fmt.Errorf("%w: put %q: %w", ErrUnavailable, key, errors.Join(failed...))
	}
	return nil
}

// Get returns key's value from the first of its owners that has it; it
// writes the value back to the owners before it that answered that they
// had not (read repair). ErrNotFound (from the cache package) if none
// has it.
func (c *Client) Get(ctx context.Context, key string) ([]byte, error) {
	ms, _, err := c.ordered(key, 1)
	if err != nil {
		return nil, err
	}
	owners := c.w.Ring().Owners(nil, key)
	var missed []Member
	var errs []error
	for _, m := range ms {
		var v []byte
		err := c.call(ctx, m, func(ctx context.Context, cl *cache.Client) (err error) {
			v, err = cl.Get(ctx, key)
			return err
		})
		switch {
		case err == nil:
			for _, o := range missed {
				if isIn(o, owners) {
					if perr := c.call(ctx, o, func(ctx context.Context, cl *cache.Client) error {
						return cl.Put(ctx, key, v, cache.PutOptions{})
					}); perr != nil {
						c.log.Debug("cluster: read repair", "key", key, "err", perr)
					}
				}
			}
			return v, nil
		case errors.Is(err, cache.ErrNotFound):
			missed = append(missed, m)
		case definitive(err) || ctx.Err() != nil:
			return nil, err
		default:
			errs = append(errs, err)
		}
	}
	if len(missed) > 0 {
		if len(errs) > 0 {
			return nil, fmt.Errorf("%w: %q on %d servers (%w)", cache.ErrNotFound, key, len(missed), errors.Join(errs...))
		}
		return nil, fmt.Errorf("%w: %q on %d servers", cache.ErrNotFound, key, len(missed))
	}
	return nil, fmt.Errorf("%w: get %q: %w", ErrUnavailable, key, errors.Join(errs...))
}

// Delete removes key from its owners (and from the next server in its
// ranking, where a copy may be from before a join). Deleting a key that
// none has is ErrNotFound.
func (c *Client) Delete(ctx context.Context, key string) error {
	ms, _, err := c.ordered(key, 1)
	if err != nil {
		return err
	}
	var errs []error
	deleted, answered := 0, 0
	for _, m := range ms {
		err := c.call(ctx, m, func(ctx context.Context, cl *cache.Client) error { return cl.Delete(ctx, key) })
		switch {
		case err == nil:
			deleted++
			answered++
		case errors.Is(err, cache.ErrNotFound):
			answered++
		case ctx.Err() != nil:
			return err
		default:
			errs = append(errs, err)
		}
	}
	switch {
	case deleted > 0:
		return nil
	case answered > 0:
		return fmt.Errorf("%w: %q", cache.ErrNotFound, key)
	}
	return fmt.Errorf("%w: delete %q: %w", ErrUnavailable, key, errors.Join(errs...))
}

func isIn(m Member, ms []Member) bool {
	for _, o := range ms {
		if o.ID == m.ID {
			return true
		}
	}
	return false
}

// RepairStats say what a Repair did.
type RepairStats struct {
	Keys    int // keys looked at
	Copied  int // copies written to owners that lacked them
	Dropped int // copies deleted from servers that no longer own them
}

// Repair makes every key of the members named (all members if none) be on
// all of its owners under the current map: it copies each key to the
// owners that lack it, and then deletes it from a server that is not one
// of its owners. A server runs it for itself after the members change,
// so that the keys of a server that left have R copies again.
func (c *Client) Repair(ctx context.Context, ids ...string) (RepairStats, error) {
	var st RepairStats
	r := c.w.Ring()
	var errs []error
	for _, m := range r.Members() {
		if len(ids) > 0 && !isIn(m, membersOf(ids)) {
			continue
		}
		var keys []string
		if err := c.call(ctx, m, func(ctx context.Context, cl *cache.Client) (err error) {
			keys, err = cl.List(ctx, "", 0)
			return err
		}); err != nil {
			errs = append(errs, err)
			continue
		}
		for _, key := range keys {
			st.Keys++
			owners := r.Owners(nil, key)
			var v []byte
			complete := true
			for _, o := range owners {
				if o.ID == m.ID {
					continue
				}
				err := c.call(ctx, o, func(ctx context.Context, cl *cache.Client) error {
					_, err := cl.Lookup(ctx, key)
					return err
				})
				if err == nil {
					continue
				}
				if !errors.Is(err, cache.ErrNotFound) {
					complete = false
					errs = append(errs, err)
					continue
				}
				if v == nil {
					if err := c.call(ctx, m, func(ctx context.Context, cl *cache.Client) (err error) {
						v, err = cl.Get(ctx, key)
						return err
					}); err != nil {
						complete = false
						if !errors.Is(err, cache.ErrNotFound) { // deleted meanwhile: nothing to copy
							errs = append(errs, err)
						}
						break
					}
				}
				if err := c.call(ctx, o, func(ctx context.Context, cl *cache.Client) error {
					return cl.Put(ctx, key, v, cache.PutOptions{})
				}); err != nil {
					complete = false
					errs = append(errs, err)
					continue
				}
				st.Copied++
			}
			if complete && !isIn(m, owners) {
				if err := c.call(ctx, m, func(ctx context.Context, cl *cache.Client) error { return cl.Delete(ctx, key) }); err == nil {
					st.Dropped++
				}
			}
			if ctx.Err() != nil {
				return st, ctx.Err()
			}
		}
	}
	return st, errors.Join(errs...)
}

// ReconcileStats say what a Reconcile did.
type ReconcileStats struct {
	Keys       int // keys the server holds
	Refreshed  int // replaced by the copy another member holds
	Unchanged  int // another member holds the same value (by size and sum): nothing fetched
	Fetched    int // values fetched from another member
	Dropped    int // deleted: every member that could hold the key said it has none
	Unverified int // kept: some member that could hold it did not answer
}

// Reconcile brings the keys of server self (which is about to join, or to
// join again after its lease was lost) in line with the members that
// stayed, before it serves them: while it was away its keys may have been
// put again or deleted, and a stale copy on a key's first owner would be
// what every Get returns. For each of its keys it asks the other members
// that could hold it (the key's owners without self, and the next in its
// ranking): the first copy found replaces self's; a key that all of them
// answer they do not have is deleted (a key deleted while self was away
// must not come back; a cache miss is always correct); a key that one of
// them could not be asked about is kept. A copy is looked up before it is
// fetched: when both servers report the value's sum (CRC32c) and they and
// the sizes agree, nothing is fetched or put. With no other member, everything
// is kept: self is the first back. Values carry no versions, so the
// members that stayed are taken to be right: a cluster whose servers all
// restart keeps whatever the first one back holds.
func (c *Client) Reconcile(ctx context.Context, self Member) (ReconcileStats, error) {
	var st ReconcileStats
	r := c.w.Ring()
	var others []Member
	for _, m := range r.Members() {
		if m.ID != self.ID {
			others = append(others, m)
		}
	}
	if len(others) == 0 {
		return st, nil
	}
	without := NewRing(others, r.Replicas())
	var keys []string
	if err := c.call(ctx, self, func(ctx context.Context, cl *cache.Client) (err error) {
		keys, err = cl.List(ctx, "", 0)
		return err
	}); err != nil {
		return st, err
	}
	var errs []error
	var cands []Member
	failed := map[string]bool{} // members that did not answer: not asked again, each would cost a CallTimeout
	for _, key := range keys {
		st.Keys++
		cands = without.Ranked(cands[:0], key, without.Replicas()+1)
		var mine *cache.Entry
		if err := c.call(ctx, self, func(ctx context.Context, cl *cache.Client) (err error) {
			mine, err = cl.Lookup(ctx, key)
			return err
		}); err != nil && !errors.Is(err, cache.ErrNotFound) {
			mine = nil // compared with nothing: fetched
		}
		var v []byte
		found, same, answered := false, false, 0
		for _, o := range cands {
			if failed[o.ID] {
				continue
			}
			err := c.call(ctx, o, func(ctx context.Context, cl *cache.Client) error {
				e, err := cl.Lookup(ctx, key)
				if err != nil {
					return err
				}
				if same = mine != nil && mine.HasSum && e.HasSum && mine.Sum == e.Sum && mine.Size == e.Size; same {
					return nil
				}
				v, err = cl.Get(ctx, key)
				if err == nil {
					st.Fetched++
				}
				return err
			})
			switch {
			case err == nil:
				found = true
			case errors.Is(err, cache.ErrNotFound):
				answered++
				continue
			case ctx.Err() != nil:
				return st, ctx.Err()
			default:
				failed[o.ID] = true
				continue
			}
			break
		}
		var err error
		switch {
		case same:
			st.Unchanged++
		case found:
			err = c.call(ctx, self, func(ctx context.Context, cl *cache.Client) error { return cl.Put(ctx, key, v, cache.PutOptions{}) })
			if err == nil {
				st.Refreshed++
			}
		case answered == len(cands):
			err = c.call(ctx, self, func(ctx context.Context, cl *cache.Client) error { return cl.Delete(ctx, key) })
			if err == nil || errors.Is(err, cache.ErrNotFound) {
				err = nil
				st.Dropped++
			}
		default:
			st.Unverified++
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("reconcile %q: %w", key, err))
		}
	}
	return st, errors.Join(errs...)
}

func membersOf(ids []string) []Member {
	ms := make([]Member, len(ids))
	for i, id := range ids {
		ms[i].ID = id
	}
	return ms
}

// RepairOnChange runs Repair for the member id (a server's own keys) after
// every change of the map, until ctx ends: the changes of settle's span
// are taken as one, and a Repair that could not reach every server is run
// again a moment later. It is how a cluster gets back to R copies of each
// key after a server leaves, without anyone asking.
func (c *Client) RepairOnChange(ctx context.Context, id string, settle time.Duration) {
	ch := c.w.Changed()
	var again <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.w.done:
			return
		case <-ch:
		case <-again:
		}
		// Wait for the changes to settle; the channel is the one of the
		// next change after the map that Repair will read, so a change
		// during the Repair brings another.
	settling:
		for {
			ch = c.w.Changed()
			select {
			case <-ctx.Done():
				return
			case <-ch:
			case <-time.After(settle):
				break settling
			}
		}
		st, err := c.Repair(ctx, id)
		if ctx.Err() != nil {
			return
		}
		again = nil
		if err != nil {
			again = time.After(max(settle, time.Second))
		}
		c.log.Info("cluster: repaired after a change", "id", id, "keys", st.Keys, "copied", st.Copied, "dropped", st.Dropped, "err", err)
	}
}
