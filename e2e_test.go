package gowarp_test

import (
	"bytes"
	"testing"

	"github.com/gowarp/gowarp"
)

func TestWriteReadSendLoopback(t *testing.T) {
	for _, crc := range []bool{false, true} {
		p := newPair(t, gowarp.ConnectOptions{CRC: crc})
		const n = 300000
		src, sbuf := p.reg(t, n, gowarp.LocalWrite)
		dst, dbuf := p.reg(t, n, gowarp.RemoteWrite|gowarp.RemoteRead|gowarp.LocalWrite)
		for i := range sbuf {
			sbuf[i] = byte(i * 7)
		}
		if err := p.a.PostSend(&gowarp.SendWR{ID: 1, Op: gowarp.OpWrite, Flags: gowarp.Signaled,
			SGL: []gowarp.SGE{{MR: src, Length: n}}, RemoteAddr: dst.Addr(), RKey: dst.STag()}); err != nil {
			t.Fatal(err)
		}
		if c := wait(t, p.acq); c.Status != gowarp.Success || c.ID != 1 || c.Op != gowarp.CompWrite {
			t.Fatalf("write completion %+v", c)
		}
		// A Read after the Write sees it.
		back, bbuf := p.reg(t, n, gowarp.LocalWrite)
		if err := p.a.PostSend(&gowarp.SendWR{ID: 2, Op: gowarp.OpRead, Flags: gowarp.Signaled,
			SGL: []gowarp.SGE{{MR: back, Length: n}}, RemoteAddr: dst.Addr(), RKey: dst.STag()}); err != nil {
			t.Fatal(err)
		}
		if c := wait(t, p.acq); c.Status != gowarp.Success || c.ID != 2 {
			t.Fatalf("read completion %+v", c)
		}
		// The responder placed the Write before it answered the Read; its
		// Placed counter is the synchronisation point for reading dbuf.
		if got := dst.Placed(); got != n {
			t.Fatalf("responder region placed %d bytes, want %d", got, n)
		}
		if !bytes.Equal(bbuf, sbuf) || !bytes.Equal(dbuf, sbuf) {
			t.Fatal("data differs")
		}
		// Send/Recv.
		rmr, rbuf := p.reg(t, n, gowarp.LocalWrite)
		if err := p.b.PostRecv(&gowarp.RecvWR{ID: 9, SGL: []gowarp.SGE{{MR: rmr, Length: n}}}); err != nil {
			t.Fatal(err)
		}
		if err := p.a.PostSend(&gowarp.SendWR{ID: 3, Op: gowarp.OpSend, Flags: gowarp.Signaled,
			SGL: []gowarp.SGE{{MR: src, Length: 100000}}}); err != nil {
			t.Fatal(err)
		}
		if c := wait(t, p.bcq); c.Status != gowarp.Success || c.ID != 9 || c.Bytes != 100000 {
			t.Fatalf("recv completion %+v", c)
		}
		if c := wait(t, p.acq); c.Status != gowarp.Success || c.ID != 3 {
			t.Fatalf("send completion %+v", c)
		}
		if !bytes.Equal(rbuf[:100000], sbuf[:100000]) {
			t.Fatal("send data differs")
		}
	}
}
