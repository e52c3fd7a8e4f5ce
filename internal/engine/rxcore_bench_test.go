package engine

import (
	"testing"

	"github.com/gowarp/gowarp/internal/mem"
	"github.com/gowarp/gowarp/wire"
)

// BenchmarkCoreWrite1448 feeds the receive core 64 KiB RDMA Writes cut
// into FPDUs of 1448 bytes, one per TCP segment of a 1500-byte MTU link
// (issue 7's real-link case), with no socket: each read brings as much
// as the core gives room for, as a busy socket does, and the driver's
// loop looks at the CQ between FPDUs as a waiter receiving inline does.
// It reports the cost per FPDU; the sub-benchmark "reads" does only the
// copies that stand for the socket's reads, to be subtracted.
func BenchmarkCoreWrite1448(b *testing.B) {
	b.Run("reads", func(b *testing.B) { benchReads(b, 1448, 64<<10) })
	for _, crc := range []bool{false, true} {
		name := "crc=off"
		if crc {
			name = "crc=on"
		}
		b.Run(name, func(b *testing.B) { benchCoreWrites(b, crc, 1448, 64<<10) })
	}
}

func benchCoreWrites(b *testing.B, crc bool, fpduLen, msg int) {
	e := newCoreEnv(b)
	const msgs = 16
	dst, err := e.table.Register(1, [][]byte{make([]byte, msg)}, mem.RemoteWrite, mem.Options{Addr: coreBase})
	if err != nil {
		b.Fatal(err)
	}
	e.reset(b, crc, 4)
	// The payload that fills an FPDU of fpduLen bytes: length, tagged
	// header, payload, CRC (fpduLen is a multiple of 4: no pad).
	per := fpduLen - 2 - wire.TaggedHeaderLen - wire.CRCLen
	data := pattern(msg, 9)
	var in []byte
	fpdus := 0
	for range msgs {
		for off := 0; off < msg; off += per {
			n := min(per, msg-off)
			h := chdr(wire.OpWrite)
			h.STag, h.TO, h.Last = uint32(dst.STag()), coreBase+uint64(off), off+n == msg
			in = append(in, e.fpdu(h, nil, data[off:off+n])...)
			fpdus++
		}
	}
	r := &e.q.rx
	feed := func() {
		for p := in; len(p) > 0; {
			k := 0
			for _, v := range r.next() {
				k += copy(v, p[k:])
				if k == len(p) {
					break
				}
			}
			p = p[k:]
			if err := r.advance(k); err != nil {
				b.Fatal(err)
			}
			for !e.cq.nonEmpty() && r.staged() {
				if err := r.advance(0); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	feed()
	if got := dst.Placed(); got != msgs*uint64(msg) {
		b.Fatalf("placed %d bytes, want %d", got, msgs*msg)
	}
	b.SetBytes(int64(len(in)))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		feed()
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*fpdus), "ns/FPDU")
	r.release()
	if dst.InUse() {
		b.Fatal("the region is still held")
	}
}

// benchReads copies what benchCoreWrites feeds, in the same pieces, into
// a staging-sized buffer: the part of its figure that is the reads'.
func benchReads(b *testing.B, fpduLen, msg int) {
	const msgs = 16
	per := fpduLen - 2 - wire.TaggedHeaderLen - wire.CRCLen
	fpdus := msgs * ((msg + per - 1) / per)
	in := make([]byte, fpdus*fpduLen)
	buf := make([]byte, rxStaging)
	b.SetBytes(int64(len(in)))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		for p := in; len(p) > 0; {
			p = p[copy(buf, p):]
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*fpdus), "ns/FPDU")
}
