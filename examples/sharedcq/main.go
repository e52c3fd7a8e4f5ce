// Command sharedcq serves many clients from one completion queue:
//
//	sharedcq server [-a ADDR] [-p 7474] [-n 4]
//	sharedcq client [-s 127.0.0.1] [-p 7474] [-n 3]
//
// The server gives every accepted queue pair the same CQ and handles all
// their completions in one loop, telling them apart by the work request ID
// it chose (the client's number, and whether it was a receive or a send;
// Completion.QP says which queue pair too). The client does the same on
// its side with -n connections. The messages are sendrecv's: 16 bytes in,
// the same in upper case back, so "sendrecv client" is a client too.
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

const msgSize = 16

// Work request IDs: the connection's number, and which of its two
// requests.
const (
	recvWR = 0
	sendWR = 1
)

func wrID(conn, kind int) uint64        { return uint64(conn)<<1 | uint64(kind) }
func fromID(id uint64) (conn, kind int) { return int(id >> 1), int(id & 1) }

// conn is one connection and its message buffer: the received request in
// the first half, the reply in the second.
type conn struct {
	qp   *gowarp.QP
	buf  []byte
	mr   *gowarp.MR
	peer string
}

func newConn(pd *gowarp.PD, cq *gowarp.CQ, i int) (*conn, error) {
	qp, err := pd.NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq, SendDepth: 1, RecvDepth: 1})
	if err != nil {
		return nil, err
	}
	c := &conn{qp: qp, buf: make([]byte, 2*msgSize)}
	if c.mr, err = pd.Register(c.buf, gowarp.LocalWrite); err != nil {
		qp.Close()
		return nil, err
	}
	// Posted before the connection is up: the peer may send at once.
	if err := qp.PostRecv(&gowarp.RecvWR{ID: wrID(i, recvWR), SGL: []gowarp.SGE{{MR: c.mr, Length: msgSize}}}); err != nil {
		qp.Close()
		return nil, err
	}
	return c, nil
}

func (c *conn) send(i int) error {
	return c.qp.PostSend(&gowarp.SendWR{ID: wrID(i, sendWR), Op: gowarp.OpSend, Flags: gowarp.Signaled,
		SGL: []gowarp.SGE{{MR: c.mr, Offset: msgSize, Length: msgSize}}})
}

func main() {
	log.SetFlags(0)
	log.SetPrefix("sharedcq: ")
	if len(os.Args) < 2 || (os.Args[1] != "server" && os.Args[1] != "client") {
		fmt.Fprintln(os.Stderr, "usage: sharedcq server|client [flags]  (sharedcq server -h for the flags)")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	fs := flag.NewFlagSet("sharedcq "+os.Args[1], flag.ExitOnError)
	port := fs.Int("p", 7474, "port")
	var err error
	if os.Args[1] == "server" {
		addr := fs.String("a", "", "address to listen on (default all)")
		n := fs.Int("n", 4, "clients to serve before exiting")
		fs.Parse(os.Args[2:])
		err = serve(ctx, net.JoinHostPort(*addr, strconv.Itoa(*port)), *n)
	} else {
		server := fs.String("s", "127.0.0.1", "server address")
		n := fs.Int("n", 3, "connections to open, all on one CQ")
		timeout := fs.Duration("timeout", 10*time.Second, "give up after this long")
		fs.Parse(os.Args[2:])
		ctx, cancel := context.WithTimeout(ctx, *timeout)
		defer cancel()
		err = clients(ctx, net.JoinHostPort(*server, strconv.Itoa(*port)), *n)
	}
	if err != nil {
		log.Fatal(err)
	}
}

func serve(ctx context.Context, addr string, n int) error {
	dev := gowarp.Open()
	pd := dev.AllocPD()
	cq := dev.NewCQ(2 * n) // room for every connection's two completions
	ln, err := dev.Listen(addr)
	if err != nil {
		return err
	}
	defer ln.Close()
	fmt.Println("listening on", ln.Addr())

	// Accept on a goroutine, so that clients already connected are served
	// while others connect. conns[i] is set before connection i's receive
	// is posted, so the loop below sees it when that receive completes.
	conns := make([]*conn, n)
	acceptErr := make(chan error, 1)
	go func() {
		for i := range n {
			req, err := ln.Accept(ctx)
			if err == nil {
				conns[i], err = newConn(pd, cq, i)
			}
			if err == nil {
				conns[i].peer = req.RemoteAddr().String()
				err = req.Accept(ctx, conns[i].qp, gowarp.ConnectOptions{})
			}
			if err != nil {
				acceptErr <- err
				return
			}
		}
	}()

	// One loop for every connection's completions.
	wc := make([]gowarp.Completion, 2*n)
	failed := 0
	for done := 0; done < n; {
		if err := cq.Wait(ctx); err != nil {
			select {
			case aerr := <-acceptErr:
				return aerr
			default:
				return err
			}
		}
		for _, c := range wc[:cq.Poll(wc)] {
			i, kind := fromID(c.ID)
			cn := conns[i]
			if err := c.Err(); err != nil {
				fmt.Printf("client %d (%s): %v: %v\n", i, cn.peer, c.Op, err)
				cn.qp.Close()
				done++
				failed++
				continue
			}
			switch kind {
			case recvWR:
				req := cn.buf[:c.Bytes]
				fmt.Printf("client %d (%s): %q\n", i, cn.peer, bytes.TrimRight(req, "\x00"))
				copy(cn.buf[msgSize:], bytes.ToUpper(req))
				if err := cn.send(i); err != nil {
					return err
				}
			case sendWR:
				// The reply has gone: done with this client. (Disconnect
				// returns at once here, with nothing left to send.)
				if err := cn.qp.Disconnect(ctx); err != nil {
					fmt.Printf("client %d (%s): disconnect: %v\n", i, cn.peer, err)
				}
				cn.qp.Close()
				done++
			}
		}
	}
	fmt.Printf("served %d clients from one CQ\n", n-failed)
	if failed > 0 {
		return fmt.Errorf("%d of %d clients failed", failed, n)
	}
	return nil
}

func clients(ctx context.Context, addr string, n int) error {
	dev := gowarp.Open()
	pd := dev.AllocPD()
	cq := dev.NewCQ(2 * n)
	conns := make([]*conn, n)
	for i := range n {
		c, err := newConn(pd, cq, i)
		if err != nil {
			return err
		}
		defer c.qp.Close()
		if err := c.qp.Connect(ctx, addr, gowarp.ConnectOptions{}); err != nil {
			return fmt.Errorf("connection %d: %w", i, err)
		}
		copy(c.buf[msgSize:], fmt.Sprintf("client %d here", i))
		if err := c.send(i); err != nil {
			return err
		}
		conns[i] = c
	}
	wc := make([]gowarp.Completion, 2*n)
	for left := 2 * n; left > 0; {
		if err := cq.Wait(ctx); err != nil {
			return err
		}
		for _, c := range wc[:cq.Poll(wc)] {
			left--
			i, kind := fromID(c.ID)
			if err := c.Err(); err != nil {
				return fmt.Errorf("connection %d: %v: %w", i, c.Op, err)
			}
			if kind == recvWR {
				fmt.Printf("connection %d: reply %q\n", i, bytes.TrimRight(conns[i].buf[:c.Bytes], "\x00"))
			}
		}
	}
	for _, c := range conns {
		if err := c.qp.Disconnect(ctx); err != nil {
			return err
		}
	}
	return nil
}
