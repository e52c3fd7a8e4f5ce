package gowarp_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
	"github.com/gowarp/gowarp/wire"
)

// TestDeregisterRacesPeerAccess: Deregister races a stream of a peer's
// Writes into a region and Reads from it. Once Deregister has returned nil
// the memory is the application's again: it fills it with a sentinel, and
// neither a Write that was on its way lands on it, nor does a Read Response
// carry any of it to the peer, while the peer keeps posting until the
// invalid STag ends the connection.
func TestDeregisterRacesPeerAccess(t *testing.T) {
	const (
		size      = 2 << 20 // Writes into the first half, Reads from the second
		writeSize = 64 << 10
		sentinel  = 0xee
	)
	iterations := 24
	if testing.Short() {
		iterations = 6
	}
	for i := range iterations {
		p := newPair(t, gowarp.ConnectOptions{CRC: i%2 == 1})
		mr, buf := p.reg(t, size, gowarp.RemoteRead|gowarp.RemoteWrite)
		fill(buf, 0x11) // the sinks of Reads will hold 0, 0x11 and 0x22, never the sentinel
		src, sbuf := p.reg(t, writeSize, 0)
		fill(sbuf, 0x22)
		var sinks []*gowarp.MR
		var sinkBufs [][]byte
		for range 4 {
			s, b := p.reg(t, size/2, gowarp.LocalWrite)
			sinks, sinkBufs = append(sinks, s), append(sinkBufs, b)
		}

		// The peer: Writes and Reads, eight outstanding, until one fails.
		// It reports why it stopped: a post or a completion refused once
		// the connection failed (expected), or a wait that ran out.
		stopped := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			var wc [16]gowarp.Completion
			out := 0
			for k := 0; ; {
				for ; out < 8; k++ {
					// Writes go to the first half, Reads come from the
					// second: a Read Response's CRC is computed before its
					// bytes are written, so a Write landing in them between
					// the two would be a CRC error.
					wr := gowarp.SendWR{ID: uint64(k), Op: gowarp.OpWrite, Flags: gowarp.Signaled,
						SGL:        []gowarp.SGE{{MR: src, Length: writeSize}},
						RemoteAddr: mr.Addr() + uint64(k*writeSize%(size/2)), RKey: mr.STag()}
					if k%2 == 1 {
						wr.Op, wr.SGL, wr.RemoteAddr = gowarp.OpRead, []gowarp.SGE{{MR: sinks[k/2%len(sinks)], Length: size / 2}}, mr.Addr()+size/2
					}
					if err := p.a.PostSend(&wr); err != nil {
						stopped <- fmt.Errorf("post %d: %w", k, err)
						return
					}
					out++
				}
				n := p.acq.Poll(wc[:])
				for _, c := range wc[:n] {
					out--
					if c.Err() != nil {
						stopped <- fmt.Errorf("completion %d: %w", c.ID, c.Err())
						return
					}
				}
				if n == 0 {
					if err := p.acq.Wait(ctx); err != nil {
						stopped <- fmt.Errorf("wait: %w (outstanding %d)", err, out)
						return
					}
				}
			}
		}()

		// Deregister at a different moment of the stream each time.
		for deadline := time.Now().Add(10 * time.Second); mr.Placed() < uint64(i%4+1)*writeSize; {
			if time.Now().After(deadline) {
				var why error
				select {
				case why = <-stopped:
				default:
				}
				t.Fatalf("iteration %d: %d bytes placed; the peer stopped: %v; QP errors %v, %v", i, mr.Placed(), why, p.a.Err(), p.b.Err())
			}
			time.Sleep(50 * time.Microsecond)
		}
		for deadline := time.Now().Add(10 * time.Second); ; {
			err := mr.Deregister()
			if err == nil {
				break
			}
			if !errors.Is(err, gowarp.ErrRegionBusy) || time.Now().After(deadline) {
				t.Fatalf("iteration %d: Deregister: %v", i, err)
			}
		}
		fill(buf[size/2:], sentinel) // the half Reads come from first: quick to be seen
		fill(buf[:size/2], sentinel)

		if err := <-stopped; errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("iteration %d: peer: %v", i, err)
		}
		p.a.Close()
		p.b.Close()
		if j := firstOther(buf, sentinel); j >= 0 {
			t.Fatalf("iteration %d: after Deregister returned, byte %d of the region was written", i, j)
		}
		for s, b := range sinkBufs {
			if j := bytes.IndexByte(b, sentinel); j >= 0 {
				t.Fatalf("iteration %d: sink %d holds the sentinel from byte %d: a Read Response read the region after Deregister returned", i, s, j)
			}
		}
	}
}

// TestPreparedCopiesPinRegions: the copies a Prepared posts pin its
// regions until they complete, even after Release: Deregister refuses
// while they are outstanding and succeeds once they are flushed.
func TestPreparedCopiesPinRegions(t *testing.T) {
	s := newServer(t, gowarp.ConnectOptions{})
	p, _ := dialRaw(t, s.ln.Addr().String(), false, 16, 16)
	qp := s.accepted(t)
	p.write(1, 0, nil) // the initiator speaks first; then the responder may Read
	sink, err := s.pd.Register(make([]byte, 4096), gowarp.LocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	rd, err := qp.Prepare(&gowarp.SendWR{Op: gowarp.OpRead, SGL: []gowarp.SGE{{MR: sink, Length: 64}}, RemoteAddr: 0x1000, RKey: 0x1100})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := rd.PostN(1, 4, true); n != 4 || err != nil {
		t.Fatalf("PostN: %d, %v", n, err)
	}
	// The raw peer takes the Read Requests and never answers them.
	for got := 0; got < 4; {
		h, _, err := p.next()
		if err != nil {
			t.Fatal(err)
		}
		if h.Opcode == wire.OpReadRequest {
			got++
		}
	}
	rd.Release()
	if err := sink.Deregister(); !errors.Is(err, gowarp.ErrRegionBusy) {
		t.Fatalf("Deregister with four prepared Reads outstanding: %v, want ErrRegionBusy", err)
	}
	if !sink.Valid() {
		t.Fatal("a refused Deregister invalidated the region")
	}
	qp.Close()
	for range 4 {
		if c := wait(t, s.cq); c.Status != gowarp.WRFlushError {
			t.Fatalf("Read completed %+v, want a flush", c)
		}
	}
	if err := sink.Deregister(); err != nil {
		t.Fatalf("Deregister after the Reads were flushed: %v", err)
	}
}

// fill sets every byte of b to v (doubling copies: quick under -race too).
func fill(b []byte, v byte) {
	if len(b) == 0 {
		return
	}
	b[0] = v
	for i := 1; i < len(b); i *= 2 {
		copy(b[i:], b[:i])
	}
}

// firstOther returns the index of the first byte of b that is not v, or -1.
func firstOther(b []byte, v byte) int {
	if bytes.Count(b, []byte{v}) == len(b) {
		return -1
	}
	for i := range b {
		if b[i] != v {
			return i
		}
	}
	return -1
}

// TestDeregisterWaitsForTransmit: a Write fails while its bytes are still
// being written to the socket (the peer reads slowly and has just sent bad
// input, so a Terminate waits behind the batch); once it has completed as
// flushed and Deregister has returned, the batch no longer reads the
// memory: the sentinel written then never reaches the wire.
func TestDeregisterWaitsForTransmit(t *testing.T) {
	const size, sentinel = 8 << 20, 0xee
	s := newServer(t, gowarp.ConnectOptions{})
	p, _ := dialRaw(t, s.ln.Addr().String(), false, 16, 16)
	qp := s.accepted(t)
	p.write(1, 0, nil) // the initiator speaks first
	sbuf := make([]byte, size)
	src, err := s.pd.Register(sbuf, 0)
	if err != nil {
		t.Fatal(err)
	}
	fill(sbuf, 0x22)
	if err := qp.PostSend(&gowarp.SendWR{ID: 1, Op: gowarp.OpWrite, Flags: gowarp.Signaled,
		SGL: []gowarp.SGE{{MR: src, Length: size}}, RemoteAddr: 0x1000, RKey: 0x1100}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond) // let the socket fill: the peer reads nothing yet
	p.write(0xbad00, 0, []byte{1})    // an unknown STag: the QP fails, a Terminate waits
	// The peer reads now, slowly, while the application deregisters.
	leaked := make(chan int, 1)
	go func() {
		n := 0
		for {
			h, rest, err := p.next()
			if err != nil || h.Opcode == wire.OpTerminate {
				leaked <- n
				return
			}
			if h.Opcode == wire.OpWrite {
				n += bytes.Count(rest, []byte{sentinel})
			}
			time.Sleep(100 * time.Microsecond)
		}
	}()
	if c := wait(t, s.cq); c.ID != 1 || c.Status != gowarp.WRFlushError {
		t.Fatalf("Write completed %+v, want a flush", c)
	}
	for deadline := time.Now().Add(20 * time.Second); ; {
		err := src.Deregister()
		if err == nil {
			break
		}
		if !errors.Is(err, gowarp.ErrRegionBusy) || time.Now().After(deadline) {
			t.Fatalf("Deregister: %v", err)
		}
	}
	fill(sbuf, sentinel)
	if n := <-leaked; n > 0 {
		t.Fatalf("%d bytes of the sentinel, written after Deregister returned, went out in the Write", n)
	}
}
