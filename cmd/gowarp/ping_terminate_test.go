package main

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/gowarp/gowarp/wire"
)

// TestPingServerTerminates: a persistent ping server (gowarp ping -s -P)
// answers each of the RFCs' error cases with a Terminate that reaches the
// peer before the connection closes, although the server closes the QP as
// soon as its receive is flushed. Before the fix the peer got a bare FIN.
func TestPingServerTerminates(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	port := strconv.Itoa(freePort(t))
	var sout, serr lockedBuf
	done := make(chan int, 1)
	go func() {
		done <- dispatch(ctx, []string{"ping", "-s", "-P", "-a", "127.0.0.1", "-p", port}, &sout, &serr)
	}()
	defer func() {
		cancel()
		<-done
	}()
	addr := "127.0.0.1:" + port
	bad := func(op wire.Opcode) wire.Header {
		return wire.Header{Opcode: op, Tagged: op.Info().Tagged, Last: true, DDPVersion: 1, RDMAPVersion: 1, QN: op.Info().QN, MSN: 1}
	}
	cases := []struct {
		name string
		h    func() wire.Header
		body []byte
		want *wire.TermError
	}{
		{"write to unknown STag", func() wire.Header { h := bad(wire.OpWrite); h.STag = 0x00ffff00; return h }, make([]byte, 8), wire.ErrDDPInvalidSTag},
		{"read of unknown STag", func() wire.Header { return bad(wire.OpReadRequest) },
			(&wire.ReadRequest{SinkSTag: 7, Size: 8, SourceSTag: 0x00ffff00}).Append(nil), wire.ErrRDMAPInvalidSTag},
		{"send longer than the receive", func() wire.Header { return bad(wire.OpSend) }, make([]byte, 4096), wire.ErrDDPNoBuffer},
		{"send with wrong MSN", func() wire.Header { h := bad(wire.OpSend); h.MSN = 9; return h }, make([]byte, 16), wire.ErrDDPInvalidMSN},
		{"send on the Read queue", func() wire.Header { h := bad(wire.OpSend); h.QN = 1; return h }, make([]byte, 16), wire.ErrDDPInvalidQN},
		{"unknown opcode", func() wire.Header { h := bad(wire.OpSend); h.Opcode = 9; return h }, nil, wire.ErrRDMAPOpcode},
		{"RDMAP version 2", func() wire.Header { h := bad(wire.OpWrite); h.RDMAPVersion = 2; return h }, nil, wire.ErrRDMAPVersion},
		{"DDP version 3", func() wire.Header { h := bad(wire.OpSend); h.DDPVersion = 3; return h }, nil, wire.ErrDDPUntaggedVersion},
	}
	reps := 10
	if testing.Short() {
		reps = 2
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for i := range reps {
				c := dialMPA(t, addr)
				h := tc.h()
				u := append(h.Append(nil), tc.body...)
				b, _ := wire.AppendFPDU(nil, u, false)
				if _, err := c.Write(b); err != nil {
					t.Fatal(err)
				}
				term, err := readTerminateFrom(c)
				c.Close()
				if err != nil {
					t.Fatalf("session %d: %v", i, err)
				}
				if !errors.Is(&term.Err, tc.want) {
					t.Fatalf("session %d: Terminate reports %v, want %v", i, &term.Err, tc.want)
				}
			}
		})
	}
	if t.Failed() {
		t.Logf("server output:\n%s%s", sout.String(), serr.String())
	}
}

// dialMPA connects as a revision 2 MPA initiator without CRC or
// peer-to-peer mode, retrying until the server listens.
func dialMPA(t *testing.T, addr string) net.Conn {
	t.Helper()
	var c net.Conn
	var err error
	for range 100 {
		if c, err = net.Dial("tcp", addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	req, _ := (&wire.MPAFrame{Revision: 2, Enhanced: true, IRD: 1, ORD: 1}).Append(nil)
	if _, err := c.Write(req); err != nil {
		t.Fatal(err)
	}
	hdr := make([]byte, wire.MPAHeaderLen)
	if _, err := io.ReadFull(c, hdr); err != nil {
		t.Fatal(err)
	}
	n, err := wire.MPAFrameLen(hdr)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, make([]byte, n-len(hdr))); err != nil {
		t.Fatal(err)
	}
	return c
}

// readTerminateFrom reads FPDUs (without CRC) until a Terminate and then
// expects the connection to end.
func readTerminateFrom(c net.Conn) (wire.Terminate, error) {
	for {
		var lb [2]byte
		if _, err := io.ReadFull(c, lb[:]); err != nil {
			return wire.Terminate{}, errors.New("no Terminate before the connection ended: " + err.Error())
		}
		b := make([]byte, wire.FPDULen(int(binary.BigEndian.Uint16(lb[:]))))
		copy(b, lb[:])
		if _, err := io.ReadFull(c, b[2:]); err != nil {
			return wire.Terminate{}, err
		}
		f, _, err := wire.ParseFPDU(b, false)
		if err != nil {
			return wire.Terminate{}, err
		}
		h, k, err := wire.ParseHeader(f.ULPDU)
		if err != nil {
			return wire.Terminate{}, err
		}
		if h.Opcode != wire.OpTerminate {
			continue
		}
		term, _, err := wire.ParseTerminate(f.ULPDU[k:])
		if err != nil {
			return term, err
		}
		if n, err := c.Read(make([]byte, 1)); n > 0 || err == nil {
			return term, errors.New("bytes after the Terminate")
		} else if ne := (net.Error)(nil); errors.As(err, &ne) && ne.Timeout() {
			return term, errors.New("the connection stayed open after the Terminate")
		}
		return term, nil
	}
}
