// Command cmatose opens many connections at once and sends a burst of
// messages each way on each, shaped like rdma-core's ucmatose
// (librdmacm/examples/cmatose.c), so that either side can be the C program:
//
//	cmatose server [-a ADDR] [-p 7471] [-c 1] [-C 10] [-S 100]
//	cmatose client [-s 127.0.0.1] [-p 7471] [-c 1] [-C 10] [-S 100]
//
// As in ucmatose, each connection has its own protection domain, queue
// pair and completion queues, and posts -C receives of -S bytes before it
// connects or accepts. Once all -c connections are up, the server sends -C
// messages of -S bytes on each and waits for them to complete and for the
// client's -C messages; the client waits for the server's messages on each
// connection, then sends -C back. The server then disconnects them all and
// the client waits for that. Every message must arrive whole: a receive of
// another size, a flushed request or a connection that ends early fails
// the run.
//
// Against siw: "ucmatose -p PORT" in the guest and "cmatose client -s
// GUEST -p PORT" here, or "cmatose server" here and "ucmatose -s HOST"
// there. Messages between two gowarp sides carry a pattern the receiver
// checks (-check); ucmatose sends whatever its buffer holds.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"time"

	"github.com/gowarp/gowarp"
)

type config struct {
	conns, count, size int
	check              bool
	opts               gowarp.ConnectOptions
}

func main() {
	log.SetFlags(0)
	log.SetPrefix("cmatose: ")
	if len(os.Args) < 2 || (os.Args[1] != "server" && os.Args[1] != "client") {
		fmt.Fprintln(os.Stderr, "usage: cmatose server|client [flags]  (cmatose server -h for the flags)")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	fs := flag.NewFlagSet("cmatose "+os.Args[1], flag.ExitOnError)
	port := fs.Int("p", 7471, "port (ucmatose's default)")
	var c config
	fs.IntVar(&c.conns, "c", 1, "connections")
	fs.IntVar(&c.count, "C", 10, "messages each way on each connection")
	fs.IntVar(&c.size, "S", 100, "message size in bytes")
	fs.BoolVar(&c.check, "check", false, "send a pattern and check the one received (both sides gowarp)")
	crc := fs.Bool("crc", false, "ask for MPA CRC")
	noP2P := fs.Bool("nop2p", false, "client: do not offer MPA peer-to-peer mode (rdma_cm on siw does not)")
	timeout := fs.Duration("timeout", time.Minute, "give up after this long")
	var addr string
	if os.Args[1] == "server" {
		a := fs.String("a", "", "address to listen on (default all, as ucmatose)")
		fs.Parse(os.Args[2:])
		addr = net.JoinHostPort(*a, strconv.Itoa(*port))
	} else {
		s := fs.String("s", "127.0.0.1", "server address (ucmatose's -s)")
		fs.Parse(os.Args[2:])
		addr = net.JoinHostPort(*s, strconv.Itoa(*port))
	}
	if fs.NArg() > 0 || c.conns < 1 || c.count < 0 || c.size < 1 {
		fmt.Fprintf(os.Stderr, "cmatose %s: want -c ≥ 1, -C ≥ 0, -S ≥ 1 and no arguments\n", os.Args[1])
		os.Exit(2)
	}
	c.opts = gowarp.ConnectOptions{CRC: *crc, NoP2P: *noP2P,
		// ucmatose's server sends first, and its client (rdma_cm on
		// siw) does not offer peer-to-peer mode, which would allow it;
		// the client posts its receives before it connects, so it is
		// ready for them (see ConnectOptions.SendFirst).
		SendFirst: os.Args[1] == "server"}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	run := client
	if os.Args[1] == "server" {
		run = server
	}
	if err := run(ctx, addr, c); err != nil {
		log.Fatal(err)
	}
}

// node is one connection, with resources of its own as ucmatose's are.
type node struct {
	id             int
	pd             *gowarp.PD
	sendCQ, recvCQ *gowarp.CQ
	qp             *gowarp.QP
	out, in        []byte // the message sent; the receives' buffer
	outMR, inMR    *gowarp.MR
}

// newNode makes a connection's queue pair and posts its receives, all
// into one buffer, as ucmatose does.
func newNode(dev *gowarp.Device, id int, c config) (*node, error) {
	n := &node{id: id, pd: dev.AllocPD(), out: make([]byte, c.size), in: make([]byte, c.size)}
	depth := max(c.count, 1)
	n.sendCQ, n.recvCQ = dev.NewCQ(depth), dev.NewCQ(depth)
	qp, err := n.pd.NewQP(gowarp.QPConfig{SendCQ: n.sendCQ, RecvCQ: n.recvCQ, SendDepth: depth, RecvDepth: depth})
	if err != nil {
		return nil, err
	}
	n.qp = qp
	if n.outMR, err = n.pd.Register(n.out, 0); err != nil {
		n.close()
		return nil, err
	}
	if n.inMR, err = n.pd.Register(n.in, gowarp.LocalWrite); err != nil {
		n.close()
		return nil, err
	}
	for i := range n.out {
		n.out[i] = pattern(i)
	}
	wr := gowarp.RecvWR{SGL: []gowarp.SGE{{MR: n.inMR, Length: c.size}}}
	for i := range c.count {
		wr.ID = uint64(i)
		if err := qp.PostRecv(&wr); err != nil {
			n.close()
			return nil, fmt.Errorf("connection %d: receive %d: %w", id, i, err)
		}
	}
	return n, nil
}

// pattern is byte i of every message (the server numbers its connections
// in the order they come, not as the client does).
func pattern(i int) byte { return byte(i*7 + i>>8) }

// close closes the queue pair, then deregisters the buffers (which its
// work pins until then).
func (n *node) close() {
	if n.qp != nil {
		n.qp.Close()
	}
	for _, mr := range []*gowarp.MR{n.outMR, n.inMR} {
		if mr != nil {
			mr.Deregister()
		}
	}
}

// send posts count signaled Sends of the whole message.
func (n *node) send(c config) error {
	wr := gowarp.SendWR{Op: gowarp.OpSend, Flags: gowarp.Signaled, SGL: []gowarp.SGE{{MR: n.outMR, Length: c.size}}}
	for i := range c.count {
		wr.ID = uint64(i)
		if err := n.qp.PostSend(&wr); err != nil {
			return fmt.Errorf("connection %d: send %d: %w", n.id, i, err)
		}
	}
	return nil
}

// await waits for count completions on cq, each a success, and for
// receives, of size bytes (with check, the peer's pattern).
func (n *node) await(ctx context.Context, cq *gowarp.CQ, what string, c config) error {
	var wc [8]gowarp.Completion
	for done := 0; done < c.count; {
		k := cq.Poll(wc[:])
		if k == 0 {
			if err := cq.Wait(ctx); err != nil {
				return fmt.Errorf("connection %d: %d of %d %s: %w", n.id, done, c.count, what, err)
			}
			continue
		}
		for _, w := range wc[:k] {
			if err := w.Err(); err != nil {
				return fmt.Errorf("connection %d: %s %d: %w (queue pair: %v)", n.id, what, w.ID, err, n.qp.Err())
			}
			if w.Op == gowarp.CompRecv && w.Bytes != c.size {
				return fmt.Errorf("connection %d: receive %d: %d bytes, want %d", n.id, w.ID, w.Bytes, c.size)
			}
		}
		done += k
	}
	// The receives share one buffer, so it is looked at only once they
	// have all completed, when no message is landing in it any more; the
	// pattern is the same in every message.
	if c.check && cq == n.recvCQ && c.count > 0 {
		return n.checkReceived()
	}
	return nil
}

// checkReceived checks that the receive buffer holds the pattern.
func (n *node) checkReceived() error {
	for i, b := range n.in {
		if b != pattern(i) {
			return fmt.Errorf("connection %d: byte %d received is %#x, want %#x", n.id, i, b, pattern(i))
		}
	}
	return nil
}

// each runs f for every node at once and returns their errors, joined.
func each(nodes []*node, f func(*node) error) error {
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() { errs[i] = f(n) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// server is ucmatose's run_server.
func server(ctx context.Context, addr string, c config) error {
	dev := gowarp.Open()
	ln, err := dev.Listen(addr)
	if err != nil {
		return err
	}
	defer ln.Close()
	fmt.Println("cmatose: listening on", ln.Addr())
	var nodes []*node
	defer func() {
		for _, n := range nodes {
			n.close()
		}
	}()
	for i := range c.conns {
		req, err := ln.Accept(ctx)
		if err != nil {
			return fmt.Errorf("%d of %d connected: %w", i, c.conns, err)
		}
		n, err := newNode(dev, i, c)
		if err != nil {
			req.Reject(nil)
			return err
		}
		nodes = append(nodes, n)
		if err := req.Accept(ctx, n.qp, c.opts); err != nil {
			return fmt.Errorf("connection %d from %v: %w", i, req.RemoteAddr(), err)
		}
	}
	fmt.Printf("cmatose: %d connected; initiating data transfers\n", len(nodes))
	if err := each(nodes, func(n *node) error {
		if err := n.send(c); err != nil {
			return err
		}
		if err := n.await(ctx, n.sendCQ, "send", c); err != nil {
			return err
		}
		return n.await(ctx, n.recvCQ, "receive", c)
	}); err != nil {
		return err
	}
	fmt.Printf("cmatose: data transfers complete: %d messages of %d bytes each way on each connection\n", c.count, c.size)
	if err := each(nodes, func(n *node) error { return n.qp.Disconnect(ctx) }); err != nil {
		return err
	}
	fmt.Println("cmatose: disconnected")
	return nil
}

// client is ucmatose's run_client.
func client(ctx context.Context, addr string, c config) error {
	dev := gowarp.Open()
	nodes := make([]*node, c.conns)
	defer func() {
		for _, n := range nodes {
			if n != nil {
				n.close()
			}
		}
	}()
	for i := range nodes {
		n, err := newNode(dev, i, c)
		if err != nil {
			return err
		}
		nodes[i] = n
	}
	fmt.Printf("cmatose: connecting %d\n", c.conns)
	err := each(nodes, func(n *node) error {
		if err := n.qp.Connect(ctx, addr, c.opts); err != nil {
			return fmt.Errorf("connection %d: %w", n.id, err)
		}
		if err := n.await(ctx, n.recvCQ, "receive", c); err != nil {
			return err
		}
		if err := n.send(c); err != nil {
			return err
		}
		if err := n.await(ctx, n.sendCQ, "send", c); err != nil {
			return err
		}
		// The server disconnects once it has every message.
		select {
		case <-n.qp.Done():
		case <-ctx.Done():
			return fmt.Errorf("connection %d: waiting for the server to disconnect: %w", n.id, ctx.Err())
		}
		if err := n.qp.Err(); !errors.Is(err, gowarp.ErrPeerClosed) {
			return fmt.Errorf("connection %d: ended with %w, want the server's disconnect", n.id, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	var nudges int
	for _, n := range nodes {
		nudges += n.qp.Nudges()
	}
	fmt.Printf("cmatose: data transfers complete: %d messages of %d bytes each way on each of %d connections; %d nudges\n", c.count, c.size, c.conns, nudges)
	return nil
}
