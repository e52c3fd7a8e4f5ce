package engine

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/gowarp/gowarp/internal/mem"
	"github.com/gowarp/gowarp/wire"
)

// fuzzSTag is a placeholder the fuzz inputs use for the STags of the
// environment's regions, which are drawn at random: fuzzSTag+i names
// region i of coreEnv.all (the receive buffers' is e.local, +5).
const fuzzSTag = 0xabcd0000

// fuzzStags replaces the placeholders in b by the environment's STags.
func fuzzStags(b []byte, e *coreEnv) {
	for i := 0; i+4 <= len(b); i++ {
		v := binary.BigEndian.Uint32(b[i:])
		if v&^0xff != fuzzSTag {
			continue
		}
		k := int(v & 0xff)
		if k < len(e.all) {
			binary.BigEndian.PutUint32(b[i:], uint32(e.all[k].STag()))
		}
	}
}

// FuzzCore feeds random bytes, in random pieces, to the receive core of a
// queue pair with receives posted and a Read outstanding: it must not
// panic nor stop taking bytes, every error must be a fault answered with
// a Terminate (or the peer's Terminate), and no region may stay held.
func FuzzCore(f *testing.F) {
	e := newCoreEnv(f)
	e.crc = false
	ph := func(i int) mem.STag { return mem.STag(fuzzSTag + i) }
	var seeds [][]byte
	seeds = append(seeds,
		e.write(ph(0), coreBase+5, pattern(8, 1)),
		append(e.write(ph(0), coreBase, pattern(2100, 2)), e.write(ph(2), coreBase+4000, pattern(96, 3))...),
		append(e.send(wire.OpSend, 1, 0, false, pattern(300, 4)), e.send(wire.OpSendSE, 1, 300, true, pattern(2100, 5))...),
		e.readReq(1, wire.ReadRequest{SinkSTag: 0x99, Size: 600, SourceSTag: uint32(ph(0)), SourceTO: coreBase + 10}),
		e.response(0, true, pattern(64, 6)),
		append(e.write(ph(0), coreBase, pattern(8, 7)), e.imm(wire.OpImmediate, 1, 0, true, 9, nil)...),
		append(e.imm(wire.OpImmediateSE, 1, 0, false, 3, pattern(30, 8)), e.imm(wire.OpImmediateSE, 1, 30, true, 3, pattern(9, 9))...),
		e.atomic(1, wire.AtomicRequest{Op: wire.AtomicCmpSwap, ReqID: 1, RemoteSTag: uint32(ph(6)), RemoteTO: coreBase + 8, AddSwap: 1, AddSwapMask: ^uint64(0)}),
	)
	// Flushes (wire/flush.go): of a range, of the whole region, and a
	// persistence flush of memory, which is refused.
	for _, fl := range []wire.Flush{
		{STag: uint32(ph(0)), TO: coreBase + 16, Len: 100},
		{STag: uint32(ph(2))},
		{Type: wire.FlushPersistence, STag: uint32(ph(0))},
	} {
		seeds = append(seeds, append(e.write(ph(0), coreBase, pattern(64, 7)), e.readReq(1, fl.ReadRequest())...))
	}
	term := wire.NewTerminate(wire.ErrDDPInvalidSTag, seeds[0][2:16], 22, nil)
	h := chdr(wire.OpTerminate)
	h.MSN = 1
	seeds = append(seeds, e.fpdu(h, term.Append(nil), nil))
	for _, c := range hostileCoreCases() {
		seeds = append(seeds, c.stream(e))
	}
	for i, s := range seeds {
		f.Add(s, uint64(i), i%2 == 0)
	}
	f.Fuzz(func(t *testing.T, in []byte, seed uint64, crc bool) {
		e.ext = seed%2 == 0 // with RFC 7306's extensions negotiated, and without
		e.reset(t, crc, 4)  // the regions stay: each input gets a new queue pair
		e.recv(t, 1, 64)
		e.recv(t, 2, 100, 1000, 2000)
		e.read(t, 3, 0, 64)
		in = bytes.Clone(in)
		fuzzStags(in, e)
		if crc {
			withCRCs(in) // or every input would stop at its first trailer
		}
		q := e.q
		if seed%4 >= 2 {
			q.rx.lastIdle = 1 // the small staging buffer after every wait (see feedCore)
		}
		err := feedCore(t, &q.rx, in, randomCuts(len(in), rand.New(rand.NewPCG(seed, 1))))
		if err != nil {
			var f *fault
			var pt *peerTerminate
			switch {
			case errors.As(err, &f):
				if f.term == nil {
					t.Fatalf("fault without a Terminate: %v", err)
				}
			case errors.As(err, &pt):
			default:
				t.Fatalf("the core failed with %v, neither a fault nor the peer's Terminate", err)
			}
			if again := q.rx.advance(0); again != err {
				t.Fatalf("after %v the core said %v", err, again)
			}
			q.rxFailed(err)
			runHandedTx(q) // writes the Terminate
		}
		q.fail(ErrClosed)
		runHandedTx(q)
		q.rx.release() // as the receive goroutine does when it ends (rxEnd)
		for i, m := range e.all {
			if m.InUse() {
				t.Errorf("region %d still pinned or held", i)
			}
		}
	})
}

// withCRCs puts the right CRC in the trailer of every whole FPDU at the
// start of b, as far as its length fields frame it.
func withCRCs(b []byte) {
	for len(b) >= 2 {
		n := wire.FPDULen(int(binary.BigEndian.Uint16(b)))
		if n > len(b) {
			return
		}
		binary.LittleEndian.PutUint32(b[n-wire.CRCLen:], wire.CRC32c(b[:n-wire.CRCLen]))
		b = b[n:]
	}
}
