package siwtest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
)

// rdma_server and rdma_client (rdma-core's librdmacm/examples) exchange one
// 16-byte Send each way: the client sends first, the server answers, both
// disconnect. rdma_server serves one client and exits.
const (
	rdmaMsgLen   = 16
	rdmaSessions = 20
)

// rdmaRequest is session i's request, as a user's client would send it.
func rdmaRequest(i int) []byte { return fmt.Appendf(nil, "gowarp req %5d", i)[:rdmaMsgLen] }

// rdmaReply is what gowarp's server answers to req.
func rdmaReply(req []byte) []byte {
	return append([]byte("re:"), req[len(req)-(rdmaMsgLen-3):]...)
}

// waitCQ waits for n completions on cq and returns them.
func waitCQ(ctx context.Context, cq *gowarp.CQ, n int) ([]gowarp.Completion, error) {
	var got []gowarp.Completion
	var wc [4]gowarp.Completion
	for len(got) < n {
		k := cq.Poll(wc[:])
		got = append(got, wc[:k]...)
		if k > 0 {
			continue
		}
		if err := cq.Wait(ctx); err != nil {
			return got, err
		}
	}
	return got, nil
}

// rdmaClientSession connects to rdma_server at addr, sends its request at
// once, and waits (boundedly) for the reply. It returns the nudges the
// queue pair sent.
func rdmaClientSession(ctx context.Context, dev *gowarp.Device, addr string, i int, o gowarp.ConnectOptions) (int, error) {
	pd := dev.AllocPD()
	cq := dev.NewCQ(8)
	qp, err := pd.NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq})
	if err != nil {
		return 0, err
	}
	defer qp.Close()
	recv, _ := pd.Register(make([]byte, rdmaMsgLen), gowarp.LocalWrite)
	send, _ := pd.Register(rdmaRequest(i), 0)
	if err := qp.PostRecv(&gowarp.RecvWR{ID: 1, SGL: []gowarp.SGE{{MR: recv, Length: rdmaMsgLen}}}); err != nil {
		return 0, err
	}
	if err := qp.Connect(ctx, addr, o); err != nil {
		return 0, err
	}
	if err := qp.PostSend(&gowarp.SendWR{ID: 2, Op: gowarp.OpSend, Flags: gowarp.Signaled,
		SGL: []gowarp.SGE{{MR: send, Length: rdmaMsgLen}}}); err != nil {
		return qp.Nudges(), err
	}
	// siw answers within milliseconds; 10 s without a reply is the hang
	// of docs/interop.md §1.
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	wcs, err := waitCQ(wctx, cq, 2)
	if err != nil {
		return qp.Nudges(), fmt.Errorf("no reply from rdma_server (%d completions: %+v; %d nudges; queue pair %v): %w", len(wcs), wcs, qp.Nudges(), qp.Err(), err)
	}
	for _, wc := range wcs {
		if wc.Status != gowarp.Success || (wc.ID == 1 && wc.Bytes != rdmaMsgLen) {
			return qp.Nudges(), fmt.Errorf("completion %+v: %v", wc, wc.Err())
		}
	}
	dctx, dcancel := context.WithTimeout(ctx, 2*time.Second)
	defer dcancel()
	qp.Disconnect(dctx)
	return qp.Nudges(), nil
}

// rdmaServerClient: 20 sessions of a gowarp client against rdma_server in
// the guest, each sending its request as soon as it is connected. Without
// the queue pair's nudges (GOWARP_SIWVM_NONUDGE=1 shows it) siw's
// responder misses the request in some session and rdma_server waits for
// it forever (docs/interop.md §1).
func (s *suite) rdmaServerClient(t *testing.T) {
	ctx := ctxFor(t, 8*time.Minute)
	var detail string
	defer func() { s.sum.add(t, t.Name(), detail) }()
	o := gowarp.ConnectOptions{NoNudge: os.Getenv("GOWARP_SIWVM_NONUDGE") != ""}
	dev := gowarp.Open()
	addr := fmt.Sprintf("127.0.0.1:%d", s.v.rping)
	nudges, nudged, done := 0, 0, 0
	for i := range rdmaSessions {
		job, err := s.v.server(ctx, guestRpingPort, fmt.Sprintf("rdma_server -p %d", guestRpingPort), time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		n, err := rdmaClientSession(ctx, dev, addr, i, o)
		nudges += n
		if n > 0 {
			nudged++
		}
		if err != nil {
			t.Errorf("session %d of %d (NoNudge %v): %v", i+1, rdmaSessions, o.NoNudge, err)
			// rdma_server stays stuck; its job's time limit ends it.
			break
		}
		rc, gout, err := job.wait(ctx)
		if err != nil || rc != 0 || !strings.Contains(gout, "rdma_server: end 0") {
			t.Errorf("session %d: guest rdma_server: rc %d, %v\n%s", i+1, rc, err, gout)
			break
		}
		done++
	}
	detail = fmt.Sprintf("%d of %d sessions, request sent at once; %d needed nudges (%d zero-length Writes)", done, rdmaSessions, nudged, nudges)
	if o.NoNudge {
		detail += "; NoNudge"
	}
}

// rdmaClientServer: rdma_client in the guest, 20 times, against a gowarp
// server on the host that answers each request.
func (s *suite) rdmaClientServer(t *testing.T) {
	ctx := ctxFor(t, 8*time.Minute)
	var detail string
	defer func() { s.sum.add(t, t.Name(), detail) }()
	dev := gowarp.Open()
	ln, err := dev.Listen(fmt.Sprintf("127.0.0.1:%d", s.v.serve))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	served := make(chan error, rdmaSessions)
	go func() {
		for {
			req, err := ln.Accept(sctx)
			if err != nil {
				return
			}
			served <- serveRDMAClient(sctx, dev, req)
		}
	}()
	script := fmt.Sprintf(`for i in $(seq %d); do rdma_client -s %s -p %d || { echo "rdma_client $i failed: $?"; exit 1; }; done`,
		rdmaSessions, hostFromGuest, guestServePort)
	rc, gout, err := s.v.run(ctx, script, 5*time.Minute)
	if err != nil || rc != 0 {
		t.Errorf("guest rdma_client loop: rc %d, %v\n%s", rc, err, tail([]byte(gout), 2000))
	}
	ends := strings.Count(gout, "rdma_client: end 0")
	ok := 0
	for range ends {
		select {
		case err := <-served:
			if err != nil {
				t.Errorf("gowarp server: %v", err)
			} else {
				ok++
			}
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
	}
	if ends != rdmaSessions || ok != rdmaSessions {
		t.Errorf("%d rdma_client runs ended well and gowarp served %d, want %d each:\n%s", ends, ok, rdmaSessions, tail([]byte(gout), 2000))
	}
	detail = fmt.Sprintf("%d of %d rdma_client sessions served by gowarp", ok, rdmaSessions)
}

// serveRDMAClient accepts one rdma_client and answers its request.
func serveRDMAClient(ctx context.Context, dev *gowarp.Device, req *gowarp.ConnRequest) error {
	pd := dev.AllocPD()
	cq := dev.NewCQ(8)
	qp, err := pd.NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq})
	if err != nil {
		req.Reject(nil)
		return err
	}
	defer qp.Close()
	recv, _ := pd.Register(make([]byte, rdmaMsgLen), gowarp.LocalWrite)
	if err := qp.PostRecv(&gowarp.RecvWR{ID: 1, SGL: []gowarp.SGE{{MR: recv, Length: rdmaMsgLen}}}); err != nil {
		return err
	}
	if err := req.Accept(ctx, qp, gowarp.ConnectOptions{}); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	wcs, err := waitCQ(wctx, cq, 1)
	if err != nil {
		return fmt.Errorf("no request from rdma_client: %w", err)
	}
	if wcs[0].Status != gowarp.Success || wcs[0].Bytes != rdmaMsgLen {
		return fmt.Errorf("request completion %+v: %v", wcs[0], wcs[0].Err())
	}
	reply, _ := pd.Register(rdmaReply(bytes.Clone(recv.Bytes())), 0)
	if err := qp.PostSend(&gowarp.SendWR{ID: 2, Op: gowarp.OpSend, Flags: gowarp.Signaled,
		SGL: []gowarp.SGE{{MR: reply, Length: rdmaMsgLen}}}); err != nil {
		return err
	}
	if wcs, err = waitCQ(wctx, cq, 1); err != nil {
		return fmt.Errorf("reply not completed: %w", err)
	}
	if wcs[0].Status != gowarp.Success {
		return fmt.Errorf("reply completion %+v: %w", wcs[0], wcs[0].Err())
	}
	// rdma_client disconnects once it has the reply.
	for qp.State() == gowarp.StateReady {
		select {
		case <-wctx.Done():
			return fmt.Errorf("rdma_client did not disconnect: %w", wctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
	return nil
}
