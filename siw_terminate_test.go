package gowarp_test

import (
	"testing"

	"github.com/gowarp/gowarp"
	"github.com/gowarp/gowarp/wire"
)

// TestSiwReadTerminateFailsTheRead: when siw finds a Read's source STag
// invalid while building the response, its Terminate (in siw's bitfield
// layout) echoes the Read Request rebuilt from its queue, with the read
// size where the MSN belongs (siw_send_terminate). gowarp must still fail
// that Read, and not another one, with a remote access error.
func TestSiwReadTerminateFailsTheRead(t *testing.T) {
	s := newServer(t, gowarp.ConnectOptions{})
	p, _ := dialRaw(t, s.ln.Addr().String(), false, 16, 16)
	qp := s.accepted(t)
	p.write(1, 0, nil) // the initiator speaks first; then the responder may Read
	sink, _ := s.pd.Register(make([]byte, 64), gowarp.LocalWrite)
	// Two Reads: the first of 2 bytes (MSN 1), the second of 1 byte
	// (MSN 2). siw's echo of the second carries MSN 1, its size.
	qp.PostSend(&gowarp.SendWR{ID: 1, Op: gowarp.OpRead, Flags: gowarp.Signaled, SGL: []gowarp.SGE{{MR: sink, Length: 2}},
		RemoteAddr: 0x1000, RKey: 0x1100})
	qp.PostSend(&gowarp.SendWR{ID: 2, Op: gowarp.OpRead, Flags: gowarp.Signaled, SGL: []gowarp.SGE{{MR: sink, Offset: 8, Length: 1}},
		RemoteAddr: 0x2000, RKey: 0xbad57a00})
	var reqs []wire.ReadRequest
	for len(reqs) < 2 {
		h, rest, err := p.next()
		if err != nil {
			t.Fatal(err)
		}
		if h.Opcode == wire.OpReadRequest {
			rr, _, _ := wire.ParseReadRequest(rest)
			reqs = append(reqs, rr)
		}
	}
	echo := hdr(wire.OpReadRequest)
	echo.MSN = reqs[1].Size // siw's bug
	rest := append([]byte{0, 0}, echo.Append(nil)...)
	rest = reqs[1].Append(rest)
	term := wire.Terminate{Err: *wire.ErrRDMAPInvalidSTag, SegLenValid: true, HasDDPHeader: true, HasRDMAHeader: true,
		SiwLayout: true, Rest: rest}
	h := hdr(wire.OpTerminate)
	h.MSN = 1
	p.send(h, term.Append(nil), nil)
	waitState(t, qp, gowarp.StateError)
	for range 2 {
		c := wait(t, s.cq)
		want := gowarp.WRFlushError
		if c.ID == 2 {
			want = gowarp.RemoteAccessError
		}
		if c.Status != want {
			t.Errorf("Read %d completed with %v, want %v", c.ID, c.Status, want)
		}
	}
}
