package gowarp_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
	"github.com/gowarp/gowarp/wire"
)

// shmFiles returns the gowarp files in /dev/shm of this process and of
// the others whose IDs are given (their names start with the ID).
func shmFiles(t testing.TB, pids ...int) []string {
	t.Helper()
	var all []string
	for _, pid := range append(pids, os.Getpid()) {
		m, err := filepath.Glob(fmt.Sprintf("/dev/shm/gowarp-shm-%08x*", pid))
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, m...)
	}
	return all
}

// TestAdapterSharedMemoryData: Writes, Reads and Sends of many sizes, one
// at a time and in bursts, arrive intact over a shared-memory link whose
// rings (the smallest, 64 KiB) wrap many times, with CRC off and on; both
// queue pairs report the link, and no file is left in /dev/shm.
//
// With alloc, the regions come from PD.Alloc, whose bytes cross by
// reference (the reader copies them from its mapping of the writer's).
func TestAdapterSharedMemoryData(t *testing.T) {
	for _, c := range []struct{ crc, alloc bool }{{false, false}, {true, false}, {false, true}, {true, true}} {
		crc := c.crc
		t.Run(fmt.Sprintf("crc=%v,alloc=%v", crc, c.alloc), func(t *testing.T) {
			o := gowarp.ConnectOptions{CRC: crc, SharedMemory: true, SharedMemoryRing: 64 << 10, PrivateData: []byte("hello")}
			p := newPair(t, o)
			if p.a.Transport() != gowarp.TransportSharedMemory || p.b.Transport() != gowarp.TransportSharedMemory {
				t.Fatalf("transports %v and %v, want shm", p.a.Transport(), p.b.Transport())
			}
			if got := p.a.Params().CRC; got != crc {
				t.Fatalf("CRC %v", got)
			}
			if string(p.a.PeerPrivateData()) != "hello" || string(p.b.PeerPrivateData()) != "hello" {
				t.Fatalf("private data %q / %q", p.a.PeerPrivateData(), p.b.PeerPrivateData())
			}
			if f := shmFiles(t); len(f) != 0 {
				t.Fatalf("files left in /dev/shm once connected: %v", f)
			}
			p.alloc = c.alloc
			shmExchange(t, p, 1<<20, []int{1, 7, 64, 100, 2047, 2048, 2049, 4099, 65536, 65537, 70001, 200003, 1 << 20})
		})
	}
}

// shmExchange runs Writes a→b, Reads of them back, and Sends a→b of each
// size, then a burst of Writes of random sizes, checking every byte.
func shmExchange(t *testing.T, p *pair, max int, sizes []int) {
	t.Helper()
	src, sbuf := p.reg(t, max, gowarp.LocalWrite)
	dst, dbuf := p.reg(t, max, gowarp.RemoteWrite|gowarp.RemoteRead)
	back, bbuf := p.reg(t, max, gowarp.LocalWrite)
	rcv, rbuf := p.reg(t, max, gowarp.LocalWrite)
	for i, n := range sizes {
		fillPattern(sbuf[:n], byte(i))
		sge := []gowarp.SGE{{MR: src, Length: n}}
		if err := p.a.PostSend(&gowarp.SendWR{ID: 1, Op: gowarp.OpWrite, Flags: gowarp.Signaled, SGL: sge, RemoteAddr: dst.Addr(), RKey: dst.STag()}); err != nil {
			t.Fatal(err)
		}
		if c := wait(t, p.acq); c.Err() != nil || c.Bytes != n {
			t.Fatalf("write %d: %+v", n, c)
		}
		// The Read's response comes after the Write's bytes: they are placed.
		if err := p.a.PostSend(&gowarp.SendWR{ID: 2, Op: gowarp.OpRead, Flags: gowarp.Signaled, SGL: []gowarp.SGE{{MR: back, Length: n}}, RemoteAddr: dst.Addr(), RKey: dst.STag()}); err != nil {
			t.Fatal(err)
		}
		if c := wait(t, p.acq); c.Err() != nil || c.Bytes != n {
			t.Fatalf("read %d: %+v", n, c)
		}
		if !bytes.Equal(dbuf[:n], sbuf[:n]) {
			t.Fatalf("write of %d bytes: data differs", n)
		}
		if !bytes.Equal(bbuf[:n], sbuf[:n]) {
			t.Fatalf("read of %d bytes: data differs", n)
		}
		if err := p.b.PostRecv(&gowarp.RecvWR{ID: 3, SGL: []gowarp.SGE{{MR: rcv, Length: max}}}); err != nil {
			t.Fatal(err)
		}
		if err := p.a.PostSend(&gowarp.SendWR{ID: 4, Op: gowarp.OpSend, SGL: sge}); err != nil {
			t.Fatal(err)
		}
		if c := wait(t, p.bcq); c.Err() != nil || c.Bytes != n {
			t.Fatalf("send %d: %+v", n, c)
		}
		if !bytes.Equal(rbuf[:n], sbuf[:n]) {
			t.Fatalf("send of %d bytes: data differs", n)
		}
	}
	// A burst: many Writes in flight, to places of their own.
	rng := rand.New(rand.NewPCG(1, 2))
	fillPattern(sbuf, 99)
	type span struct{ off, n int }
	var spans []span
	for off := 0; off < max; {
		n := min(1+rng.IntN(100_000), max-off)
		spans = append(spans, span{off, n})
		off += n
	}
	clear(dbuf)
	for i, s := range spans {
		wr := gowarp.SendWR{ID: uint64(i), Op: gowarp.OpWrite, SGL: []gowarp.SGE{{MR: src, Offset: s.off, Length: s.n}}, RemoteAddr: dst.Addr() + uint64(s.off), RKey: dst.STag()}
		if i == len(spans)-1 {
			wr.Flags = gowarp.Signaled
		}
		for deadline := time.Now().Add(10 * time.Second); ; {
			err := p.a.PostSend(&wr)
			if err == nil {
				break
			}
			if !errorsIsQueueFull(err) || time.Now().After(deadline) {
				t.Fatalf("burst, Write %d of %d: %v", i, len(spans), err)
			}
			time.Sleep(time.Millisecond)
		}
	}
	if c := wait(t, p.acq); c.Err() != nil {
		t.Fatalf("burst: %+v", c)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := dst.WaitPlaced(ctx, dst.Placed()); err != nil {
		t.Fatal(err)
	}
	// The last Write's completion came when its bytes were in the ring; a
	// Read behind them all returns once they are placed.
	if err := p.a.PostSend(&gowarp.SendWR{ID: 5, Op: gowarp.OpRead, Flags: gowarp.Signaled, SGL: []gowarp.SGE{{MR: back, Length: 1}}, RemoteAddr: dst.Addr(), RKey: dst.STag()}); err != nil {
		t.Fatal(err)
	}
	if c := wait(t, p.acq); c.Err() != nil {
		t.Fatalf("read after the burst: %+v", c)
	}
	if !bytes.Equal(dbuf, sbuf) {
		t.Fatal("burst of Writes: data differs")
	}
}

func errorsIsQueueFull(err error) bool { return err != nil && errors.Is(err, gowarp.ErrQueueFull) }

// TestAdapterSharedMemoryFallback: a gowarp peer that does not ask for
// shared memory, on either side, gets TCP, with its private data as sent
// and data moving as ever; no file is left behind.
func TestAdapterSharedMemoryFallback(t *testing.T) {
	for _, tt := range []struct {
		name           string
		client, server bool
	}{{"server did not ask", true, false}, {"client did not ask", false, true}} {
		t.Run(tt.name, func(t *testing.T) {
			p := newPairOpts(t,
				gowarp.ConnectOptions{SharedMemory: tt.client, PrivateData: []byte("from client")},
				gowarp.ConnectOptions{SharedMemory: tt.server, PrivateData: []byte("from server")})
			if p.a.Transport() != gowarp.TransportTCP || p.b.Transport() != gowarp.TransportTCP {
				t.Fatalf("transports %v and %v, want tcp", p.a.Transport(), p.b.Transport())
			}
			if string(p.a.PeerPrivateData()) != "from server" || string(p.b.PeerPrivateData()) != "from client" {
				t.Fatalf("private data %q / %q", p.a.PeerPrivateData(), p.b.PeerPrivateData())
			}
			if f := shmFiles(t); len(f) != 0 {
				t.Fatalf("files left in /dev/shm: %v", f)
			}
			shmExchange(t, p, 256<<10, []int{1, 4099, 200003})
		})
	}
}

// TestAdapterSharedMemoryRawPeer: peers that are not gowarp get the TCP
// stream. A raw initiator's request, carrying no offer, is answered as
// ever by a responder that would take one; a raw responder, which does
// not answer the offer, gets FPDUs on the socket from an initiator that
// made one; and an initiator that did not ask sends the request byte for
// byte as before.
func TestAdapterSharedMemoryRawPeer(t *testing.T) {
	t.Run("raw initiator", func(t *testing.T) {
		s := newServer(t, gowarp.ConnectOptions{SharedMemory: true})
		mr, err := s.pd.Register(make([]byte, 64), gowarp.RemoteWrite)
		if err != nil {
			t.Fatal(err)
		}
		raw, rep := dialRaw(t, s.ln.Addr().String(), false, 1, 1)
		if len(rep.PrivateData) != 0 {
			t.Fatalf("reply's private data %q", rep.PrivateData)
		}
		qp := s.accepted(t)
		if qp.Transport() != gowarp.TransportTCP {
			t.Fatalf("transport %v", qp.Transport())
		}
		raw.write(uint32(mr.STag()), mr.Addr(), []byte("over tcp"))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := mr.WaitPlaced(ctx, 8); err != nil {
			t.Fatal(err)
		}
		if string(mr.Bytes()[:8]) != "over tcp" {
			t.Fatalf("placed %q", mr.Bytes()[:8])
		}
	})
	for _, ask := range []bool{true, false} {
		t.Run(fmt.Sprintf("raw responder, offered %v", ask), func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			reqs := make(chan wire.MPAFrame, 1)
			conns := make(chan net.Conn, 1)
			go func() {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				f, err := readMPAFrame(c)
				if err != nil {
					c.Close()
					return
				}
				reqs <- f
				rep, _ := (&wire.MPAFrame{Reply: true, Revision: 2, Enhanced: true, IRD: 1, ORD: 1, PrivateData: []byte("raw")}).Append(nil)
				c.Write(rep)
				conns <- c
			}()
			p := newIdlePair(t, 16)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := p.a.Connect(ctx, ln.Addr().String(), gowarp.ConnectOptions{SharedMemory: ask, NoP2P: true, NoNudge: true, PrivateData: []byte("app")}); err != nil {
				t.Fatal(err)
			}
			defer p.a.Close()
			f := <-reqs
			c := <-conns
			defer c.Close()
			if !ask && string(f.PrivateData) != "app" {
				t.Fatalf("request's private data %q, want exactly the application's", f.PrivateData)
			}
			if ask && (len(f.PrivateData) != 3+64 || string(f.PrivateData[:3]) != "app") {
				t.Fatalf("request's private data %q, want the application's and the 64-byte offer", f.PrivateData)
			}
			if p.a.Transport() != gowarp.TransportTCP || string(p.a.PeerPrivateData()) != "raw" {
				t.Fatalf("transport %v, private data %q", p.a.Transport(), p.a.PeerPrivateData())
			}
			if f := shmFiles(t); len(f) != 0 {
				t.Fatalf("files left in /dev/shm: %v", f)
			}
			src, _ := p.reg(t, 8, 0)
			copy(src.Bytes(), "fpdu ok!")
			if err := p.a.PostSend(&gowarp.SendWR{Op: gowarp.OpWrite, SGL: []gowarp.SGE{{MR: src, Length: 8}}, RemoteAddr: 100, RKey: 7}); err != nil {
				t.Fatal(err)
			}
			raw := &rawPeer{t: t, c: c}
			c.SetDeadline(time.Now().Add(10 * time.Second))
			h, rest, err := raw.next()
			if err != nil {
				t.Fatal(err)
			}
			if h.Opcode != wire.OpWrite || h.STag != 7 || h.TO != 100 || string(rest) != "fpdu ok!" {
				t.Fatalf("FPDU %+v %q", h, rest)
			}
		})
	}
}

// TestAdapterSharedMemoryPeerCloses: a peer that disconnects after its
// Writes has them all placed, and the queue pair then fails with
// ErrPeerClosed.
func TestAdapterSharedMemoryPeerCloses(t *testing.T) {
	p := newPair(t, gowarp.ConnectOptions{SharedMemory: true, SharedMemoryRing: 64 << 10})
	const n, size = 64, 50_000
	src, sbuf := p.reg(t, size, 0)
	dst, dbuf := p.reg(t, n*size, gowarp.RemoteWrite)
	fillPattern(sbuf, 3)
	for i := range n {
		wr := gowarp.SendWR{Op: gowarp.OpWrite, SGL: []gowarp.SGE{{MR: src, Length: size}}, RemoteAddr: dst.Addr() + uint64(i*size), RKey: dst.STag()}
		if err := p.a.PostSend(&wr); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.a.Disconnect(ctx); err != nil {
		t.Fatal(err)
	}
	if err := dst.WaitPlaced(ctx, n*size); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if !bytes.Equal(dbuf[i*size:(i+1)*size], sbuf) {
			t.Fatalf("Write %d differs", i)
		}
	}
	waitState(t, p.b, gowarp.StateError)
	if err := p.b.Err(); !errors.Is(err, gowarp.ErrPeerClosed) {
		t.Fatalf("peer's error %v, want ErrPeerClosed", err)
	}
}

// TestAdapterSharedMemoryHotPathAllocs: over a shared-memory link too,
// posting, transmitting, receiving, placing and completing allocate
// nothing in steady state, and no goroutine starts per operation. The
// rings are the default's, which hold the largest message whole, as the
// loopback socket's buffer does in TestHotPathAllocs: a post that finds
// the ring full hands the rest to the transmit goroutine, whose
// completion then wakes the waiter's read on the connection with a
// deadline, whose error net allocates (over TCP as well).
func TestAdapterSharedMemoryHotPathAllocs(t *testing.T) {
	o := gowarp.ConnectOptions{SharedMemory: true}
	hotPathAllocs(t, o)
	hotPathAllocsOf(t, o, true) // by reference
	preparedAndProgressAllocs(t, o)
}

// wantTransport fails the test unless p got the link o asks for.
func wantTransport(t *testing.T, p *pair, o gowarp.ConnectOptions) {
	t.Helper()
	want := gowarp.TransportTCP
	if o.SharedMemory {
		want = gowarp.TransportSharedMemory
	}
	if p.a.Transport() != want || p.b.Transport() != want {
		t.Fatalf("transports %v and %v, want %v", p.a.Transport(), p.b.Transport(), want)
	}
}

// TestAdapterSharedMemoryTerminate: a Write to an STag the peer does not
// have is answered with a Terminate through the ring, as over TCP: the
// requester's queue pair fails with the peer's reason and its work is
// flushed, the peer's with its own.
func TestAdapterSharedMemoryTerminate(t *testing.T) {
	p := newPair(t, gowarp.ConnectOptions{SharedMemory: true})
	src, _ := p.reg(t, 4096, gowarp.LocalWrite)
	// One doorbell: the Terminate may come back before a second post.
	wrs := []gowarp.SendWR{
		{ID: 1, Op: gowarp.OpWrite, SGL: []gowarp.SGE{{MR: src, Length: 4096}}, RemoteAddr: 0, RKey: 0x1234500},
		{ID: 2, Op: gowarp.OpRead, Flags: gowarp.Signaled, SGL: []gowarp.SGE{{MR: src, Length: 8}}, RemoteAddr: 0, RKey: 0x1234500},
	}
	if _, err := p.a.PostSendList(wrs); err != nil {
		t.Fatal(err)
	}
	// The Write, unsignaled, is reported only if the Terminate fell on
	// it (it had not left the ring when it came); the Read always, in
	// error.
	for {
		c := wait(t, p.acq)
		if c.Err() == nil {
			t.Fatalf("completion %+v, want an error", c)
		}
		if c.ID == 2 {
			break
		}
	}
	waitState(t, p.a, gowarp.StateError)
	if err := p.a.Err(); !errors.Is(err, gowarp.ErrPeerTerminated) || !errors.Is(err, wire.ErrDDPInvalidSTag) {
		t.Fatalf("requester's error %v, want the peer's Terminate for an invalid STag", err)
	}
	waitState(t, p.b, gowarp.StateError)
	if err := p.b.Err(); !errors.Is(err, gowarp.ErrTerminated) {
		t.Fatalf("responder's error %v, want ErrTerminated", err)
	}
}

// TestAdapterSharedMemoryAllocAcked: in Acked mode a Write from PD.Alloc
// memory, which crosses by reference, completes only once the peer has
// copied it: at each completion the peer's region holds the bytes, and
// the source may be changed at once for the next Write.
func TestAdapterSharedMemoryAllocAcked(t *testing.T) {
	p := newIdlePairMode(t, 64, gowarp.Acked, true)
	t.Cleanup(func() { p.a.Close(); p.b.Close() })
	o := gowarp.ConnectOptions{SharedMemory: true}
	p.connect(t, o, o)
	if p.a.Transport() != gowarp.TransportSharedMemory {
		t.Fatalf("transport %v", p.a.Transport())
	}
	const n = 300_000
	src, sbuf := p.reg(t, n, gowarp.LocalWrite)
	dst, dbuf := p.reg(t, n, gowarp.RemoteWrite)
	for i := range 200 {
		fillPattern(sbuf, byte(i))
		if err := p.a.PostSend(&gowarp.SendWR{ID: uint64(i), Op: gowarp.OpWrite, Flags: gowarp.Signaled,
			SGL: []gowarp.SGE{{MR: src, Length: n}}, RemoteAddr: dst.Addr(), RKey: dst.STag()}); err != nil {
			t.Fatal(err)
		}
		if c := wait(t, p.acq); c.Err() != nil {
			t.Fatalf("write %d: %v", i, c.Err())
		}
		if !bytes.Equal(dbuf, sbuf) {
			t.Fatalf("write %d completed before the peer had its bytes", i)
		}
	}
}
