package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/gowarp/gowarp"
	"github.com/gowarp/gowarp/cache"
	"github.com/gowarp/gowarp/cache/cluster"
)

// clusterFlags are the flags that put a command in a cluster (package
// cluster): the etcd that keeps the members, and the cluster's name.
type clusterFlags struct {
	etcd *string
	name *string
}

func addClusterFlags(fs *flag.FlagSet) clusterFlags {
	return clusterFlags{
		etcd: fs.String("etcd", os.Getenv("GOWARP_ETCD"), "etcd `endpoints` (comma-separated) of a cluster: members and key map there, keys on several servers (default $GOWARP_ETCD; empty: one server, -addr)"),
		name: fs.String("cluster", "default", "the cluster's `name` in etcd"),
	}
}

func (f clusterFlags) on() bool { return *f.etcd != "" }

func (f clusterFlags) dial() (*clientv3.Client, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(*f.etcd, ","), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("etcd: %w", err)
	}
	return cli, nil
}

// serveFlags are serve's cluster flags beside clusterFlags.
type serveFlags struct {
	clusterFlags
	id        *string
	advertise *string
	replicas  *int
	ttl       *time.Duration
}

func addServeClusterFlags(fs *flag.FlagSet) serveFlags {
	host, _ := os.Hostname()
	return serveFlags{clusterFlags: addClusterFlags(fs),
		id:        fs.String("id", host, "this server's `ID` in the cluster: unique, and the same across restarts (it places keys)"),
		advertise: fs.String("advertise", "", "the `host:port` clients dial this server at (default: the address listened on)"),
		replicas:  fs.Int("replicas", cluster.DefaultReplicas, "servers that keep each key, for a new cluster (an existing one keeps its own)"),
		ttl:       fs.Duration("ttl", cluster.DefaultTTL, "lease of the membership: how soon the others notice this server died"),
	}
}

// joinCluster registers the server in the cluster and repairs its keys
// after each change of the map, until ctx ends; the returned leave
// function deregisters it.
func joinCluster(ctx context.Context, f serveFlags, addr, httpAddr string, log *slog.Logger) (leave func(), err error) {
	cli, err := f.dial()
	if err != nil {
		return nil, err
	}
	if *f.advertise != "" {
		addr = *f.advertise
	}
	jctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cc, err := cluster.NewClient(jctx, cli, *f.name, cluster.ClientOptions{Logger: log,
		Cache: cache.ClientOptions{Device: gowarp.Open(gowarp.WithLogger(log)), Logger: log}})
	if err != nil {
		cli.Close()
		return nil, err
	}
	self := cluster.Member{ID: *f.id, Addr: addr, HTTP: httpAddr}
	// Before it is in the map (again), the server brings its keys in line
	// with the members that stayed: a restarted server's copies may be
	// stale.
	prepare := func(ctx context.Context) error {
		st, err := cc.Reconcile(ctx, self)
		log.Info("cache: reconciled with the cluster", "keys", st.Keys, "refreshed", st.Refreshed,
			"dropped", st.Dropped, "unverified", st.Unverified, "err", err)
		return nil // what could not be checked is kept; the join goes on
	}
	reg, err := cluster.Join(jctx, cli, *f.name, self,
		cluster.JoinOptions{TTL: *f.ttl, Replicas: *f.replicas, Prepare: prepare, Logger: log})
	if err != nil {
		cc.Close()
		cli.Close()
		return nil, err
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); cc.RepairOnChange(rctx, *f.id, time.Second) }()
	log.Info("cache: joined cluster", "cluster", *f.name, "id", *f.id, "addr", addr, "members", cc.Ring().Len(), "replicas", cc.Ring().Replicas())
	return func() {
		stop()
		<-done
		cc.Close()
		lctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := reg.Leave(lctx); err != nil {
			log.Warn("cache: leave cluster", "err", err)
		}
		cli.Close()
	}, nil
}

// cacheClusterCommand runs put, get, del and members through a cluster.
func cacheClusterCommand(ctx context.Context, f clusterFlags, sub string, args []string, durable bool, stdout, stderr io.Writer, log *slog.Logger) error {
	cli, err := f.dial()
	if err != nil {
		return err
	}
	defer cli.Close()
	if sub == "members" {
		w, err := cluster.Watch(ctx, cli, *f.name, cluster.WatchOptions{Logger: log})
		if err != nil {
			return err
		}
		defer w.Close()
		r := w.Ring()
		fmt.Fprintf(stdout, "cluster %s: %d members, %d replicas of each key\n", *f.name, r.Len(), r.Replicas())
		for _, m := range r.Members() {
			fmt.Fprintf(stdout, "%s\t%s\thttp %s\tsince %s\n", m.ID, m.Addr, orDash(m.HTTP), m.Started.Format(time.RFC3339))
		}
		for id, err := range w.Invalid() {
			fmt.Fprintf(stdout, "ignored %q: %v\n", id, err)
		}
		return nil
	}
	c, err := cluster.NewClient(ctx, cli, *f.name, cluster.ClientOptions{Logger: log,
		Cache: cache.ClientOptions{Device: gowarp.Open(gowarp.WithLogger(log)), Logger: log}})
	if err != nil {
		return err
	}
	defer c.Close()
	switch sub {
	case "put":
		var v []byte
		if len(args) < 2 || args[1] == "-" {
			v, err = io.ReadAll(os.Stdin)
		} else {
			v, err = os.ReadFile(args[1])
		}
		if err != nil {
			return err
		}
		return c.Put(ctx, args[0], v, cache.PutOptions{Durable: durable})
	case "get":
		v, err := c.Get(ctx, args[0])
		if err != nil {
			return err
		}
		if len(args) < 2 || args[1] == "-" {
			_, err = stdout.Write(v)
			return err
		}
		return os.WriteFile(args[1], v, 0o644)
	case "del":
		return c.Delete(ctx, args[0])
	}
	return errors.New(sub + " talks to one server: give -addr, not -etcd")
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
