package gowarp_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/gowarp/gowarp"
)

// ExampleQP_ProgressFunc is an echo server whose loop answers each Send
// from the wait itself: no return from a wait per message, and between
// messages the reader sleeps without reading an emptied socket first.
func ExampleQP_ProgressFunc() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dev := gowarp.Open()
	pd := dev.AllocPD()
	ln, err := dev.Listen("127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()

	// The server: one receive posted, and a loop that echoes what comes.
	srvBuf := make([]byte, 64)
	srvMR, _ := pd.Register(srvBuf, gowarp.LocalWrite)
	srvCQ := dev.NewCQ(16)
	srv, _ := pd.NewQP(gowarp.QPConfig{SendCQ: srvCQ, RecvCQ: srvCQ})
	defer srv.Close()
	recv := gowarp.RecvWR{SGL: []gowarp.SGE{{MR: srvMR, Length: 64}}}
	srv.PostRecv(&recv)
	go func() {
		req, err := ln.Accept(ctx)
		if err != nil {
			log.Fatal(err)
		}
		if err := req.Accept(ctx, srv, gowarp.ConnectOptions{}); err != nil {
			log.Fatal(err)
		}
		var wc [4]gowarp.Completion
		srv.ProgressFunc(ctx, func() bool {
			for _, c := range wc[:srvCQ.Poll(wc[:])] {
				if c.Err() != nil {
					return false // the client went
				}
				if c.Op == gowarp.CompRecv {
					srv.PostSend(&gowarp.SendWR{Op: gowarp.OpSend, SGL: []gowarp.SGE{{MR: srvMR, Length: c.Bytes}}})
					srv.PostRecv(&recv)
				}
			}
			return true
		})
	}()

	// The client sends three messages, one at a time, and reads the echoes.
	buf := make([]byte, 128)
	mr, _ := pd.Register(buf, gowarp.LocalWrite)
	cq := dev.NewCQ(16)
	qp, _ := pd.NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq})
	defer qp.Close()
	if err := qp.Connect(ctx, ln.Addr().String(), gowarp.ConnectOptions{}); err != nil {
		log.Fatal(err)
	}
	var wc [4]gowarp.Completion
	for _, msg := range []string{"one", "two", "three"} {
		qp.PostRecv(&gowarp.RecvWR{SGL: []gowarp.SGE{{MR: mr, Offset: 64, Length: 64}}})
		n := copy(buf, msg)
		qp.PostSend(&gowarp.SendWR{Op: gowarp.OpSend, SGL: []gowarp.SGE{{MR: mr, Length: n}}})
		for got := false; !got; {
			if err := cq.Wait(ctx); err != nil {
				log.Fatal(err)
			}
			for _, c := range wc[:cq.Poll(wc[:])] {
				if c.Op == gowarp.CompRecv {
					fmt.Printf("echo: %s\n", buf[64:64+c.Bytes])
					got = true
				}
			}
		}
	}
	// Output:
	// echo: one
	// echo: two
	// echo: three
}
