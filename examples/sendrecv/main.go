// Command sendrecv is request/reply over Send/Receive, shaped like
// rdma-core's rdma_server and rdma_client (librdmacm/examples), so that
// either side can be the C program:
//
//	sendrecv server [-a ADDR] [-p 7471] [-size 16] [-n 1]
//	sendrecv client [-s 127.0.0.1] [-p 7471] [-size 16] [-msg TEXT]
//
// Like them, each side posts its receive before the connection is up; the
// client sends one message of -size bytes (16, as theirs), the server
// answers with one, and both disconnect. rdma_server replies with 16 zero
// bytes; this server replies with the request in upper case.
//
// Against siw: "rdma_server" in the guest and "sendrecv client -s GUEST",
// or "sendrecv server" here and "rdma_client -s HOST" there. rdma_cm on siw
// neither asks for nor grants MPA peer-to-peer mode, so the client does not
// ask for it unless -p2p is given, and sends first, as rdma_client does.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"strconv"
	"time"

	"github.com/gowarp/gowarp"
)

func main() {
	log.SetFlags(0)
	log.SetPrefix("sendrecv: ")
	if len(os.Args) < 2 || (os.Args[1] != "server" && os.Args[1] != "client") {
		fmt.Fprintln(os.Stderr, "usage: sendrecv server|client [flags]  (sendrecv server -h for the flags)")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	fs := flag.NewFlagSet("sendrecv "+os.Args[1], flag.ExitOnError)
	port := fs.Int("p", 7471, "port (rdma_server's and rdma_client's default)")
	size := fs.Int("size", 16, "message size in bytes (rdma_server and rdma_client use 16); the server's receives\nare this big, so a client's messages must not be bigger")
	crc := fs.Bool("crc", false, "ask for MPA CRC")
	if os.Args[1] == "server" {
		addr := fs.String("a", "", "address to listen on (default all, as rdma_server)")
		n := fs.Int("n", 1, "clients to serve, one after another, before exiting (rdma_server serves 1)")
		fs.Parse(os.Args[2:])
		if err := serve(ctx, net.JoinHostPort(*addr, strconv.Itoa(*port)), *size, *n, *crc); err != nil {
			log.Fatal(err)
		}
		return
	}
	server := fs.String("s", "127.0.0.1", "server address (rdma_client's -s)")
	msg := fs.String("msg", "hello, server", "the request's text (cut or zero-padded to -size)")
	p2p := fs.Bool("p2p", false, "ask for MPA peer-to-peer mode (rdma_cm on siw does not)")
	timeout := fs.Duration("timeout", 10*time.Second, "give up after this long")
	noNudge := fs.Bool("nonudge", false, "do not wake a server that missed the request while it accepted (gowarp.ConnectOptions.NoNudge;\nsiw's rdma_server then never answers in some sessions)")
	fs.Parse(os.Args[2:])
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	o := gowarp.ConnectOptions{CRC: *crc, NoP2P: !*p2p, NoNudge: *noNudge}
	if err := request(ctx, net.JoinHostPort(*server, strconv.Itoa(*port)), *size, *msg, o); err != nil {
		log.Fatal(err)
	}
}

// request is rdma_client: post a receive, connect, send, wait for the send
// and then for the reply, disconnect.
func request(ctx context.Context, addr string, size int, msg string, o gowarp.ConnectOptions) error {
	dev := gowarp.Open()
	pd := dev.AllocPD()
	cq := dev.NewCQ(4)
	qp, err := pd.NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq, SendDepth: 1, RecvDepth: 1})
	if err != nil {
		return err
	}
	defer qp.Close()

	// One buffer: the request in the first half, the reply lands in the second.
	buf := make([]byte, 2*size)
	mr, err := pd.Register(buf, gowarp.LocalWrite)
	if err != nil {
		return err
	}
	copy(buf[:size], msg)
	// The reply may come as soon as the request is out: receive first.
	if err := qp.PostRecv(&gowarp.RecvWR{ID: 1, SGL: []gowarp.SGE{{MR: mr, Offset: size, Length: size}}}); err != nil {
		return err
	}
	if err := qp.Connect(ctx, addr, o); err != nil {
		return err
	}
	if err := qp.PostSend(&gowarp.SendWR{ID: 2, Op: gowarp.OpSend, Flags: gowarp.Signaled,
		SGL: []gowarp.SGE{{MR: mr, Length: size}}}); err != nil {
		return err
	}
	for range 2 { // the send's completion and the reply's, in either order
		c, err := next(ctx, cq)
		if err != nil {
			return err
		}
		if c.Op == gowarp.CompRecv {
			fmt.Printf("reply: %q (%d bytes)\n", bytes.TrimRight(buf[size:size+c.Bytes], "\x00"), c.Bytes)
		}
	}
	if n := qp.Nudges(); n > 0 {
		// siw's server had missed the request (see ConnectOptions.NoNudge).
		fmt.Printf("woke the server with %d zero-length Writes\n", n)
	}
	return qp.Disconnect(ctx)
}

// serve is rdma_server, n times: post a receive, accept, wait for the
// request, send the reply, wait for it to go, disconnect.
func serve(ctx context.Context, addr string, size, n int, crc bool) error {
	dev := gowarp.Open()
	ln, err := dev.Listen(addr)
	if err != nil {
		return err
	}
	defer ln.Close()
	fmt.Println("listening on", ln.Addr())
	for range n {
		req, err := ln.Accept(ctx)
		if err != nil {
			return err
		}
		if err := serveOne(ctx, dev, req, size, crc); err != nil {
			return fmt.Errorf("client %v: %w", req.RemoteAddr(), err)
		}
	}
	return nil
}

func serveOne(ctx context.Context, dev *gowarp.Device, req *gowarp.ConnRequest, size int, crc bool) error {
	pd := dev.AllocPD()
	buf := make([]byte, 2*size)
	mr, err := pd.Register(buf, gowarp.LocalWrite)
	if err != nil {
		return err
	}
	// A server outlives its clients: their regions go with them, after
	// their queue pair (deferred later, it closes first).
	defer mr.Deregister()
	cq := dev.NewCQ(4)
	qp, err := pd.NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq, SendDepth: 1, RecvDepth: 1})
	if err != nil {
		return err
	}
	defer qp.Close()
	// Posted before Accept, so the client may send at once.
	if err := qp.PostRecv(&gowarp.RecvWR{ID: 1, SGL: []gowarp.SGE{{MR: mr, Length: size}}}); err != nil {
		return err
	}
	if err := req.Accept(ctx, qp, gowarp.ConnectOptions{CRC: crc}); err != nil {
		return err
	}
	c, err := next(ctx, cq)
	if err != nil {
		return err
	}
	fmt.Printf("request from %v: %q (%d bytes)\n", req.RemoteAddr(), bytes.TrimRight(buf[:c.Bytes], "\x00"), c.Bytes)
	copy(buf[size:], bytes.ToUpper(buf[:c.Bytes]))
	if err := qp.PostSend(&gowarp.SendWR{ID: 2, Op: gowarp.OpSend, Flags: gowarp.Signaled,
		SGL: []gowarp.SGE{{MR: mr, Offset: size, Length: size}}}); err != nil {
		return err
	}
	if _, err := next(ctx, cq); err != nil {
		return err
	}
	return qp.Disconnect(ctx)
}

// next waits for one completion and returns it, or its error.
func next(ctx context.Context, cq *gowarp.CQ) (gowarp.Completion, error) {
	var wc [1]gowarp.Completion
	for cq.Poll(wc[:]) == 0 {
		if err := cq.Wait(ctx); err != nil {
			return wc[0], err
		}
	}
	if err := wc[0].Err(); err != nil {
		// A flushed request says little; the queue pair says why.
		if qerr := wc[0].QP.Err(); qerr != nil {
			return wc[0], fmt.Errorf("work request %d (%v): %w: %w", wc[0].ID, wc[0].Op, err, qerr)
		}
		return wc[0], fmt.Errorf("work request %d (%v): %w", wc[0].ID, wc[0].Op, err)
	}
	return wc[0], nil
}
