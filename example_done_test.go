package gowarp_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"log"
	"time"

	"github.com/gowarp/gowarp"
)

// ExampleQP_Done is a passive server: it exposes a region for each client
// to Write and Read one-sided, posts no work of its own, and so has no
// completion to wake it when the client goes. Done tells the session's
// goroutine, which then frees what the client used.
func ExampleQP_Done() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dev := gowarp.Open()
	pd := dev.AllocPD()
	ln, err := dev.Listen("127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()

	ended := make(chan struct{})
	go func() {
		req, err := ln.Accept(ctx)
		if err != nil {
			log.Fatal(err)
		}
		mr, _ := pd.Alloc(4096, gowarp.LocalWrite|gowarp.RemoteWrite|gowarp.RemoteRead)
		defer mr.Deregister()
		cq := dev.NewCQ(4)
		qp, _ := pd.NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq})
		defer qp.Close()
		// The region's STag and address go to the client in the reply.
		pdata := binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint32(nil, uint32(mr.STag())), mr.Addr())
		if err := req.Accept(ctx, qp, gowarp.ConnectOptions{PrivateData: pdata}); err != nil {
			log.Fatal(err)
		}
		select {
		case <-qp.Done():
			fmt.Printf("server: client gone (%v); it wrote %q\n", qp.Err(), mr.Bytes()[:5])
		case <-ctx.Done():
		}
		close(ended)
	}()

	// The client Writes five bytes into the server's region and leaves.
	buf := []byte("hello")
	mr, _ := pd.Register(buf, gowarp.LocalWrite)
	cq := dev.NewCQ(4)
	qp, _ := pd.NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq})
	if err := qp.Connect(ctx, ln.Addr().String(), gowarp.ConnectOptions{}); err != nil {
		log.Fatal(err)
	}
	pdata := qp.PeerPrivateData()
	rkey, raddr := binary.BigEndian.Uint32(pdata), binary.BigEndian.Uint64(pdata[4:])
	qp.PostSend(&gowarp.SendWR{Op: gowarp.OpWrite, Flags: gowarp.Signaled,
		SGL: []gowarp.SGE{{MR: mr, Length: len(buf)}}, RemoteAddr: raddr, RKey: gowarp.STag(rkey)})
	if err := cq.Wait(ctx); err != nil {
		log.Fatal(err)
	}
	var wc [1]gowarp.Completion
	cq.Poll(wc[:])
	fmt.Println("client: write", wc[0].Status.String())
	qp.Disconnect(ctx)
	qp.Close()
	<-ended
	// Output:
	// client: write success
	// server: client gone (gowarp: peer closed the connection); it wrote "hello"
}
