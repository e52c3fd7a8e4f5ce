package siwtest

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
	"github.com/gowarp/gowarp/wire"
)

// siwTerminates plays a siw responder that answers the first FPDU it gets
// with the Terminate siw sent for it in the guest (docs/interop.md), in
// siw's own layout, and closes: body is the Terminate body as captured,
// with the echoed MSN patched to the one received.
func siwTerminates(t *testing.T, ln net.Listener, body string) {
	c, err := ln.Accept()
	if err != nil {
		t.Error(err)
		return
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	hdr := make([]byte, wire.MPAHeaderLen)
	if _, err := io.ReadFull(c, hdr); err != nil {
		t.Error(err)
		return
	}
	n, _ := wire.MPAFrameLen(hdr)
	if _, err := io.ReadFull(c, make([]byte, n-len(hdr))); err != nil {
		t.Error(err)
		return
	}
	rep := wire.MPAFrame{Reply: true, Revision: 2, Enhanced: true, IRD: 1, ORD: 1}
	b, _ := rep.Append(nil)
	c.Write(b)
	var l [2]byte
	if _, err := io.ReadFull(c, l[:]); err != nil {
		t.Error(err)
		return
	}
	ulpdu := make([]byte, wire.FPDULen(int(binary.BigEndian.Uint16(l[:])))-2)
	if _, err := io.ReadFull(c, ulpdu); err != nil {
		t.Error(err)
		return
	}
	h, _, err := wire.ParseHeader(ulpdu)
	if err != nil {
		t.Error(err)
		return
	}
	term, _ := hex.DecodeString(strings.ReplaceAll(body, " ", ""))
	if !h.Tagged {
		binary.BigEndian.PutUint32(term[4+2+10:], h.MSN) // the echoed header's MSN
	}
	u := (&wire.Header{Opcode: wire.OpTerminate, Last: true, DDPVersion: 1, RDMAPVersion: 1, QN: wire.QNTerminate, MSN: 1}).Append(nil)
	fpdu, _ := wire.AppendFPDU(nil, append(u, term...), false)
	c.Write(fpdu)
	time.Sleep(100 * time.Millisecond)
}

// TestSiwTerminateFailsTheRightWork: the Terminates siw sends, in its
// bitfield layout, fail the work they echo with a remote access error
// and put the queue pair in error with siw's reason.
func TestSiwTerminateFailsTheRightWork(t *testing.T) {
	tests := []struct {
		name string
		op   gowarp.WROp
		body string
		want *wire.TermError
	}{
		{"Read of a bad STag", gowarp.OpRead,
			"10000700 0000 4141 00000000 00000001 00000001 00000000 4fa4df00 000019e60162b230 00000010 bad57a00 0000000000001000",
			wire.ErrRDMAPInvalidSTag},
		{"Write to a bad STag", gowarp.OpWrite, "11000300 0010 c140 bad57a00 0000000000001000", wire.ErrDDPInvalidSTag},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			go siwTerminates(t, ln, tt.body)
			dev := gowarp.Open()
			pd := dev.AllocPD()
			cq := dev.NewCQ(16)
			qp, err := pd.NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq})
			if err != nil {
				t.Fatal(err)
			}
			defer qp.Close()
			if err := qp.Connect(ctx, ln.Addr().String(), gowarp.ConnectOptions{NoP2P: true, IRD: 1, ORD: 1}); err != nil {
				t.Fatal(err)
			}
			mr, _ := pd.Register(make([]byte, 16), gowarp.LocalWrite)
			// A Write completes when the socket takes it; the Send behind
			// it is what the Terminate flushes.
			if err := qp.PostSend(&gowarp.SendWR{ID: 1, Op: tt.op, Flags: gowarp.Signaled, SGL: []gowarp.SGE{{MR: mr, Length: 16}},
				RemoteAddr: 0x1000, RKey: 0xbad57a00}); err != nil {
				t.Fatal(err)
			}
			if err := waitQPError(ctx, qp); !errors.Is(err, gowarp.ErrPeerTerminated) || !errors.Is(err, tt.want) {
				t.Errorf("queue pair error %v, want the peer's %v", err, tt.want)
			}
			var wc [4]gowarp.Completion
			n := cq.Poll(wc[:])
			if n == 0 {
				t.Fatal("no completion")
			}
			if tt.op == gowarp.OpRead && (wc[0].ID != 1 || wc[0].Status != gowarp.RemoteAccessError) {
				t.Errorf("Read completed %+v, want a remote access error", wc[0])
			}
		})
	}
}
