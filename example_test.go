package gowarp_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/gowarp/gowarp"
)

// Example_tour is the README's tour, run as a test so the README stays true.
func Example_tour() {
	ctx := context.Background()
	dev := gowarp.Open()
	pd := dev.AllocPD()

	// Server: listen, accept with a reply carrying its buffer's address.
	ln, err := dev.Listen("127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	srvBuf := make([]byte, 4096)
	srvMR, _ := pd.Register(srvBuf, gowarp.LocalWrite|gowarp.RemoteRead|gowarp.RemoteWrite)
	srvCQ := dev.NewCQ(64)
	srv, _ := pd.NewQP(gowarp.QPConfig{SendCQ: srvCQ, RecvCQ: srvCQ})
	go func() {
		req, err := ln.Accept(ctx)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("client says %q\n", req.PrivateData())
		// Receives may be posted before the connection is up.
		srv.PostRecv(&gowarp.RecvWR{ID: 1, SGL: []gowarp.SGE{{MR: srvMR, Offset: 2048, Length: 2048}}})
		req.Accept(ctx, srv, gowarp.ConnectOptions{PrivateData: []byte("welcome")})
	}()

	// Client: connect, register, then WRITE, READ and SEND.
	cq := dev.NewCQ(64)
	qp, _ := pd.NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq})
	if err := qp.Connect(ctx, ln.Addr().String(), gowarp.ConnectOptions{PrivateData: []byte("hello")}); err != nil {
		log.Fatal(err)
	}
	buf := make([]byte, 4096)
	mr, _ := pd.Register(buf, gowarp.LocalWrite)
	copy(buf, "written with RDMA WRITE")
	remote, rkey := srvMR.Addr(), srvMR.STag() // normally sent over in private data or a Send

	qp.PostSend(&gowarp.SendWR{ID: 1, Op: gowarp.OpWrite, Flags: gowarp.Signaled,
		SGL: []gowarp.SGE{{MR: mr, Length: 23}}, RemoteAddr: remote, RKey: rkey})
	qp.PostSend(&gowarp.SendWR{ID: 2, Op: gowarp.OpRead, Flags: gowarp.Signaled,
		SGL: []gowarp.SGE{{MR: mr, Offset: 1024, Length: 23}}, RemoteAddr: remote, RKey: rkey})
	qp.PostSend(&gowarp.SendWR{ID: 3, Op: gowarp.OpSend, Flags: gowarp.Signaled,
		SGL: []gowarp.SGE{{MR: mr, Length: 5}}})

	var wc [8]gowarp.Completion
	for done := 0; done < 3; {
		if err := cq.Wait(ctx); err != nil {
			log.Fatal(err)
		}
		n := cq.Poll(wc[:])
		for _, c := range wc[:n] {
			if err := c.Err(); err != nil {
				log.Fatalf("work request %d: %v", c.ID, err)
			}
			fmt.Println("completed", c.Op, c.ID, c.Bytes, "bytes")
		}
		done += n
	}
	fmt.Printf("read back %q\n", buf[1024:1047])
	srvCQ.Wait(ctx)
	n := srvCQ.Poll(wc[:])
	fmt.Println("server received", wc[:n][0].Bytes, "bytes")
	qp.Close()
	srv.Close()
	// Output:
	// client says "hello"
	// completed write 1 23 bytes
	// completed read 2 23 bytes
	// completed send 3 5 bytes
	// read back "written with RDMA WRITE"
	// server received 5 bytes
}

// ExampleMR_WaitPlaced waits, without polling, for a peer's RDMA Write to
// land: the one-sided way to receive, with no receive posted and no
// completion on this side.
func ExampleMR_WaitPlaced() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dev := gowarp.Open()
	pd := dev.AllocPD()
	ln, err := dev.Listen("127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()

	// The server exposes a buffer and tells the client where it is.
	inbox := make([]byte, 64)
	inboxMR, _ := pd.Register(inbox, gowarp.RemoteWrite)
	srvCQ := dev.NewCQ(8)
	srv, _ := pd.NewQP(gowarp.QPConfig{SendCQ: srvCQ, RecvCQ: srvCQ})
	defer srv.Close()
	where := binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint32(nil, uint32(inboxMR.STag())), inboxMR.Addr())
	go func() {
		req, err := ln.Accept(ctx)
		if err != nil {
			log.Fatal(err)
		}
		req.Accept(ctx, srv, gowarp.ConnectOptions{PrivateData: where})
	}()

	// The client writes into it.
	cq := dev.NewCQ(8)
	qp, _ := pd.NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq})
	defer qp.Close()
	if err := qp.Connect(ctx, ln.Addr().String(), gowarp.ConnectOptions{}); err != nil {
		log.Fatal(err)
	}
	pdata := qp.PeerPrivateData()
	msg := []byte("hello, one-sided")
	mr, _ := pd.Register(msg, 0)
	want := inboxMR.Placed() + uint64(len(msg)) // Placed counts from registration on
	qp.PostSend(&gowarp.SendWR{Op: gowarp.OpWrite, SGL: []gowarp.SGE{{MR: mr, Length: len(msg)}},
		RKey: gowarp.STag(binary.BigEndian.Uint32(pdata)), RemoteAddr: binary.BigEndian.Uint64(pdata[4:])})

	if err := inboxMR.WaitPlaced(ctx, want); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s\n", inbox[:len(msg)])
	// Output: hello, one-sided
}

// ExampleDevice_Events watches a device's asynchronous events: here the
// server closes its end once it has the client's message, and the client
// learns of it without posting or polling anything.
func ExampleDevice_Events() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dev := gowarp.Open()
	pd := dev.AllocPD()
	ln, err := dev.Listen("127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()

	srvCQ := dev.NewCQ(8)
	srv, _ := pd.NewQP(gowarp.QPConfig{SendCQ: srvCQ, RecvCQ: srvCQ})
	rbuf, _ := pd.Register(make([]byte, 64), gowarp.LocalWrite)
	srv.PostRecv(&gowarp.RecvWR{ID: 1, SGL: []gowarp.SGE{{MR: rbuf, Length: 64}}})
	go func() {
		req, err := ln.Accept(ctx)
		if err != nil {
			log.Fatal(err)
		}
		req.Accept(ctx, srv, gowarp.ConnectOptions{})
		srvCQ.Wait(ctx) // the client's message
		srv.Close()
	}()

	cq := dev.NewCQ(8)
	qp, _ := pd.NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq})
	defer qp.Close()
	if err := qp.Connect(ctx, ln.Addr().String(), gowarp.ConnectOptions{}); err != nil {
		log.Fatal(err)
	}
	msg, _ := pd.Register([]byte("bye"), 0)
	qp.PostSend(&gowarp.SendWR{Op: gowarp.OpSend, SGL: []gowarp.SGE{{MR: msg, Length: 3}}})

	for {
		select {
		case e := <-dev.Events():
			if e.QP != qp {
				continue // the server's own events
			}
			switch e.Type {
			case gowarp.EventPeerClosed:
				fmt.Println("peer closed:", errors.Is(e.Err, gowarp.ErrPeerClosed))
			case gowarp.EventQPFatal, gowarp.EventPeerTerminated:
				fmt.Println("failed:", e.Err)
			case gowarp.EventLastWQE:
				fmt.Println("all work requests completed")
				return
			}
		case <-ctx.Done():
			log.Fatal(ctx.Err())
		}
	}
	// Output:
	// peer closed: true
	// all work requests completed
}

// ExampleNoReads connects asking for no RDMA Reads either way (IRD and ORD
// 0, as perftest's write_bw does): the peer learns it in the MPA exchange,
// and a Read posted anyway is refused at once.
func ExampleNoReads() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dev := gowarp.Open()
	pd := dev.AllocPD()
	ln, err := dev.Listen("127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	srvCQ := dev.NewCQ(8)
	srv, _ := pd.NewQP(gowarp.QPConfig{SendCQ: srvCQ, RecvCQ: srvCQ})
	defer srv.Close()
	accepted := make(chan struct{})
	go func() {
		defer close(accepted)
		req, err := ln.Accept(ctx)
		if err != nil {
			log.Fatal(err)
		}
		ird, ord, _ := req.ReadLimits()
		fmt.Printf("client asks IRD %d, ORD %d\n", ird, ord)
		req.Accept(ctx, srv, gowarp.ConnectOptions{}) // the defaults, 16 and 16
	}()

	cq := dev.NewCQ(8)
	qp, _ := pd.NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq})
	defer qp.Close()
	if err := qp.Connect(ctx, ln.Addr().String(), gowarp.ConnectOptions{IRD: gowarp.NoReads, ORD: gowarp.NoReads}); err != nil {
		log.Fatal(err)
	}
	<-accepted
	fmt.Printf("settled: client IRD %d ORD %d, server ORD %d\n", qp.Params().IRD, qp.Params().ORD, srv.Params().ORD)
	sink, _ := pd.Register(make([]byte, 8), gowarp.LocalWrite)
	err = qp.PostSend(&gowarp.SendWR{Op: gowarp.OpRead, SGL: []gowarp.SGE{{MR: sink, Length: 8}}, RKey: 1})
	fmt.Println(errors.Is(err, gowarp.ErrZeroORD))
	// Output:
	// client asks IRD 0, ORD 0
	// settled: client IRD 0 ORD 0, server ORD 0
	// true
}
