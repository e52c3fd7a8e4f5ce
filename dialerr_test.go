package gowarp_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
	"github.com/gowarp/gowarp/cache"
	"github.com/gowarp/gowarp/rpc"
)

// TestDialErrorNamesAddressOnce: a dial refused says where once, through
// every layer that wraps it (QP.Connect, rpc.Dial, cache.Dial, a
// Session): "rpc: dial 127.0.0.1:7700: gowarp: connect 127.0.0.1:7700:
// dial tcp 127.0.0.1:7700: connect: connection refused" named it three
// times.
func TestDialErrorNamesAddressOnce(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // refused from now on
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p := newIdlePair(t, 16)
	errs := map[string]error{"QP.Connect": p.a.Connect(ctx, addr, gowarp.ConnectOptions{})}
	_, errs["rpc.Dial"] = rpc.Dial(ctx, p.dev, addr, rpc.Options{})
	_, errs["cache.Dial"] = cache.Dial(ctx, addr, cache.ClientOptions{})
	_, errs["DialSession"] = p.pd.DialSession(ctx, []string{addr}, gowarp.SessionConfig{})
	for what, err := range errs {
		if err == nil {
			t.Fatalf("%s to a closed port succeeded", what)
		}
		if n := strings.Count(err.Error(), addr); n != 1 {
			t.Errorf("%s: %q names %s %d times, want once", what, err, addr, n)
		}
	}
}
