package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Defaults.
const (
	DefaultTTL      = 5 * time.Second
	DefaultReplicas = 2
)

// Prefix is the etcd key prefix under which cluster name keeps its
// records: <prefix>config and <prefix>members/<id>.
func Prefix(name string) string { return "/gowarp/cache/" + name + "/" }

func membersPrefix(name string) string { return Prefix(name) + "members/" }
func configKey(name string) string     { return Prefix(name) + "config" }

// JoinOptions tune Join. Zero values mean the defaults.
type JoinOptions struct {
	// TTL is the lease's time to live: how long after this server dies
	// the others notice (default 5 s; etcd counts whole seconds).
	TTL time.Duration
	// Replicas is R for a cluster that has no config yet (the first
	// server writes it; later ones keep what is there). Default 2.
	Replicas int
	// Prepare, if set, runs before the record is put in etcd: in Join,
	// and again before each registration after a lost lease, when the
	// others have taken this server out of the map and its keys may have
	// changed without it. A server reconciles its keys here
	// (Client.Reconcile). Its error fails Join; on a registration again
	// it is logged, and the registration goes on.
	Prepare func(ctx context.Context) error
	Logger  *slog.Logger
}

// Registration is a server's membership: its record in etcd under a lease
// that it keeps alive until Leave.
type Registration struct {
	cli     *clientv3.Client
	key     string
	rec     string
	ttl     int64
	log     *slog.Logger
	prepare func(context.Context) error
	cancel  context.CancelFunc
	done    chan struct{}

	mu    sync.Mutex
	lease clientv3.LeaseID
}

// Join registers m in cluster name under a lease and keeps the lease
// alive until Leave (or until the process dies: then the lease expires and
// the record goes with it). A record of the same ID with another address
// is another live server: ErrMemberExists. One with the same address is
// this server's from before a restart, and is taken over.
func Join(ctx context.Context, cli *clientv3.Client, name string, m Member, o JoinOptions) (*Registration, error) {
	if m.Started.IsZero() {
		m.Started = time.Now().UTC().Truncate(time.Millisecond)
	}
	rec, err := m.AppendRecord(nil)
	if err != nil {
		return nil, err
	}
	if o.TTL <= 0 {
		o.TTL = DefaultTTL
	}
	if o.Replicas <= 0 {
		o.Replicas = DefaultReplicas
	}
	if o.Replicas > MaxReplicas {
		return nil, fmt.Errorf("%w: %d replicas (at most %d)", ErrBadConfig, o.Replicas, MaxReplicas)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	cfg := fmt.Sprintf(`{"replicas":%d}`, o.Replicas)
	ck := configKey(name)
	if _, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(ck), "=", 0)).
		Then(clientv3.OpPut(ck, cfg)).Commit(); err != nil {
		return nil, fmt.Errorf("cluster: write config: %w", err)
	}
	r := &Registration{cli: cli, key: membersPrefix(name) + m.ID, rec: string(rec),
		ttl: max(1, int64((o.TTL+time.Second-1)/time.Second)), log: o.Logger, prepare: o.Prepare, done: make(chan struct{})}
	if r.prepare != nil {
		if err := r.prepare(ctx); err != nil {
			return nil, fmt.Errorf("cluster: prepare to join: %w", err)
		}
	}
	if err := r.register(ctx, m); err != nil {
		return nil, err
	}
	kctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go r.keepAlive(kctx, m)
	return r, nil
}

// register grants a lease and puts the record under it.
func (r *Registration) register(ctx context.Context, m Member) error {
	lease, err := r.cli.Grant(ctx, r.ttl)
	if err != nil {
		return fmt.Errorf("cluster: grant lease: %w", err)
	}
	put := clientv3.OpPut(r.key, r.rec, clientv3.WithLease(lease.ID))
	resp, err := r.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(r.key), "=", 0)).
		Then(put).Else(clientv3.OpGet(r.key)).Commit()
	if err == nil && !resp.Succeeded {
		kvs := resp.Responses[0].GetResponseRange().GetKvs()
		if len(kvs) == 1 {
			old, perr := ParseMember(m.ID, kvs[0].Value)
			if perr == nil && old.Addr != m.Addr {
				err = fmt.Errorf("%w: %s is at %s", ErrMemberExists, quoteID(m.ID), old.Addr)
			} else {
				// Ours from before a restart (or unreadable): take it
				// over, unless it changed meanwhile.
				var tr *clientv3.TxnResponse
				tr, err = r.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(r.key), "=", kvs[0].ModRevision)).
					Then(put).Commit()
				if err == nil && !tr.Succeeded {
					err = fmt.Errorf("%w: %s changed while joining", ErrMemberExists, quoteID(m.ID))
				}
			}
		}
	}
	if err != nil {
		// Best effort: the lease expires on its own anyway.
		rctx, cancel := context.WithTimeout(context.Background(), time.Second)
		r.cli.Revoke(rctx, lease.ID)
		cancel()
		if errors.Is(err, ErrMemberExists) {
			return err
		}
		return fmt.Errorf("cluster: register: %w", err)
	}
	r.mu.Lock()
	r.lease = lease.ID
	r.mu.Unlock()
	return nil
}

// keepAlive keeps the lease alive; when it is lost (etcd unreachable
// longer than the TTL) it registers again, with a new lease, until Leave.
func (r *Registration) keepAlive(ctx context.Context, m Member) {
	defer close(r.done)
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		r.mu.Lock()
		lease := r.lease
		r.mu.Unlock()
		ch, err := r.cli.KeepAlive(ctx, lease)
		if err == nil {
			for range ch {
				backoff = 100 * time.Millisecond
			}
		}
		if ctx.Err() != nil {
			return
		}
		r.log.Warn("cluster: lease lost; registering again", "key", r.key, "err", err)
		if r.prepare != nil {
			if err := r.prepare(ctx); err != nil {
				r.log.Warn("cluster: prepare to register again", "key", r.key, "err", err)
			}
		}
		taken := false
		if !retry(ctx, &backoff, func() bool {
			err := r.register(ctx, m)
			taken = errors.Is(err, ErrMemberExists)
			return err == nil || taken
		}) || taken {
			if taken {
				r.log.Error("cluster: cannot register again: another server took the ID", "key", r.key)
			}
			return
		}
	}
}

// retry calls f after a pause, doubling the pause (*backoff, up to 5 s)
// each time, until f returns true (then retry does) or ctx ends (false).
func retry(ctx context.Context, backoff *time.Duration, f func() bool) bool {
	for {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(*backoff):
		}
		*backoff = min(2**backoff, 5*time.Second)
		if f() {
			return true
		}
	}
}

// Leave removes the record (it revokes the lease) and stops keeping it
// alive. The other servers and the clients notice at once.
func (r *Registration) Leave(ctx context.Context) error {
	r.cancel()
	<-r.done
	r.mu.Lock()
	lease := r.lease
	r.mu.Unlock()
	if _, err := r.cli.Revoke(ctx, lease); err != nil {
		return fmt.Errorf("cluster: leave: %w", err)
	}
	return nil
}

// Membership follows a cluster's members and config in etcd.
type Membership struct {
	cli    *clientv3.Client
	name   string
	log    *slog.Logger
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	rev     int64
	members map[string]Member
	invalid map[string]error
	cfg     Config
	ring    *Ring
	changed chan struct{}
}

// WatchOptions tune Watch.
type WatchOptions struct {
	Logger *slog.Logger
}

// Watch reads cluster name's members and config from etcd and follows
// their changes until Close. A member record that does not parse is left
// out (Invalid tells which, and why); a config that does not parse is an
// error at the start and is ignored (the last good one is kept) after.
func Watch(ctx context.Context, cli *clientv3.Client, name string, o WatchOptions) (*Membership, error) {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	w := &Membership{cli: cli, name: name, log: o.Logger, done: make(chan struct{}), changed: make(chan struct{})}
	if err := w.load(ctx, true); err != nil {
		return nil, err
	}
	wctx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	go w.follow(wctx)
	return w, nil
}

// load reads everything under the cluster's prefix at one revision.
func (w *Membership) load(ctx context.Context, first bool) error {
	resp, err := w.cli.Get(ctx, Prefix(w.name), clientv3.WithPrefix())
	if err != nil {
		return fmt.Errorf("cluster: read members: %w", err)
	}
	members, invalid := map[string]Member{}, map[string]error{}
	cfg := Config{Replicas: DefaultReplicas}
	w.mu.Lock()
	if !first {
		cfg = w.cfg
	}
	w.mu.Unlock()
	for _, kv := range resp.Kvs {
		if err := w.apply(members, invalid, &cfg, string(kv.Key), kv.Value, false); err != nil && first {
			return err
		}
	}
	w.set(resp.Header.Revision, members, invalid, cfg)
	return nil
}

// apply applies one key's value (or its deletion) to a member map; it
// returns an error only for a bad config.
func (w *Membership) apply(members map[string]Member, invalid map[string]error, cfg *Config, key string, value []byte, deleted bool) error {
	mp := membersPrefix(w.name)
	switch {
	case key == configKey(w.name):
		if deleted {
			return nil
		}
		c, err := ParseConfig(value)
		if err != nil {
			w.log.Warn("cluster: config ignored", "key", key, "err", err)
			return err
		}
		*cfg = c
	case strings.HasPrefix(key, mp):
		id := key[len(mp):]
		delete(members, id)
		delete(invalid, id)
		if deleted {
			return nil
		}
		m, err := ParseMember(id, value)
		if err != nil {
			w.log.Warn("cluster: member record ignored", "key", key, "err", err)
			invalid[id] = err
			return nil
		}
		members[id] = m
	}
	return nil
}

func (w *Membership) set(rev int64, members map[string]Member, invalid map[string]error, cfg Config) {
	ring := NewRing(slices.Collect(maps.Values(members)), cfg.Replicas)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.rev, w.members, w.invalid, w.cfg, w.ring = rev, members, invalid, cfg, ring
	close(w.changed)
	w.changed = make(chan struct{})
}

// follow watches the prefix from the revision loaded; after a watch that
// fails (etcd compacted past it, or unreachable), it loads again.
func (w *Membership) follow(ctx context.Context) {
	defer close(w.done)
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		w.mu.Lock()
		rev := w.rev
		w.mu.Unlock()
		// A watch of its own context, so that leaving it early ends it.
		wctx, wcancel := context.WithCancel(ctx)
		wch := w.cli.Watch(clientv3.WithRequireLeader(wctx), Prefix(w.name), clientv3.WithPrefix(), clientv3.WithRev(rev+1))
		for resp := range wch {
			if err := resp.Err(); err != nil {
				w.log.Info("cluster: watch", "err", err)
				break
			}
			backoff = 100 * time.Millisecond
			w.mu.Lock()
			members, invalid, cfg := maps.Clone(w.members), maps.Clone(w.invalid), w.cfg
			w.mu.Unlock()
			for _, ev := range resp.Events {
				w.apply(members, invalid, &cfg, string(ev.Kv.Key), ev.Kv.Value, ev.Type == clientv3.EventTypeDelete)
			}
			w.set(resp.Header.Revision, members, invalid, cfg)
		}
		wcancel()
		if !retry(ctx, &backoff, func() bool {
			lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			err := w.load(lctx, false)
			if err != nil {
				w.log.Info("cluster: reload members", "err", err)
			}
			return err == nil
		}) {
			return
		}
	}
}

// Ring returns the current map of keys to members.
func (w *Membership) Ring() *Ring {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ring
}

// Changed returns a channel closed at the next change of the members or
// the config.
func (w *Membership) Changed() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.changed
}

// Invalid returns the member records left out because they do not parse,
// by ID, with why.
func (w *Membership) Invalid() map[string]error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return maps.Clone(w.invalid)
}

// Close stops following etcd.
func (w *Membership) Close() {
	w.cancel()
	<-w.done
}
