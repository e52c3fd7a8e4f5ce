// Package etcdtest starts an etcd for a test: one node, in process, on
// loopback ports of its own, its data in the test's temporary directory.
// Only tests import it, so the server is never linked into gowarp.
package etcdtest

import (
	"net/url"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Start starts the etcd until the test ends and returns its client
// endpoint (host:port).
func Start(t testing.TB) string {
	t.Helper()
	cfg := embed.NewConfig()
	cfg.Dir = t.TempDir()
	cfg.Name = "test"
	u := func(s string) []url.URL { p, _ := url.Parse(s); return []url.URL{*p} }
	// Port 0: the kernel picks, and the listeners say which.
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = u("http://127.0.0.1:0"), u("http://127.0.0.1:0")
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = u("http://127.0.0.1:0"), u("http://127.0.0.1:0")
	cfg.InitialCluster = "test=http://127.0.0.1:0"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	cfg.LogLevel = "error"
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		t.Fatal("etcd did not start in 30 s")
	}
	return e.Clients[0].Addr().String()
}
