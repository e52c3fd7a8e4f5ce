package engine

import (
	"context"
	"testing"
	"time"

	"github.com/gowarp/gowarp/internal/cm"
	"github.com/gowarp/gowarp/internal/mem"
)

// TestBusyPollReachesLink: ConnectOptions.BusyPoll is each side's own
// choice, and reaches that side's TCP link with the queue pair's
// doorbell; a side that did not ask for it does not spin.
func TestBusyPollReachesLink(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	newQP := func() *QP {
		cq := NewCQ(16)
		q, err := NewQP(Config{SendDepth: 8, RecvDepth: 8, SendCQ: cq, RecvCQ: cq, PD: 1, Table: mem.NewTable()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { q.Close() })
		return q
	}
	ini, rsp := newQP(), newQP()
	a, b := tcpPair(t)
	errc := make(chan error, 1)
	go func() {
		req, err := cm.ReadRequest(ctx, b)
		if err == nil {
			err = rsp.Accept(ctx, req, ConnectOptions{})
		}
		errc <- err
	}()
	if err := ini.ConnectConn(ctx, a, ConnectOptions{BusyPoll: 250 * time.Microsecond}); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		q    *QP
		want time.Duration
	}{{"initiator (asked)", ini, 250 * time.Microsecond}, {"responder (did not ask)", rsp, 0}} {
		l, ok := c.q.link.(*fdLink)
		if !ok {
			t.Fatalf("%s: link %T, want a TCP link", c.name, c.q.link)
		}
		if l.spinFor != c.want || (c.want > 0) != (l.bell == &c.q.bell) {
			t.Errorf("%s: busy poll %v (doorbell given: %t), want %v", c.name, l.spinFor, l.bell != nil, c.want)
		}
	}
}
