package engine

import (
	"errors"
	"testing"
	"time"

	"github.com/gowarp/gowarp/wire"
)

// TestPeerTerminateErrBeforeCompletion: the reason a peer's Terminate gives
// is in Err from the moment the send entry it echoes carries its status.
// Between the two, the transmit path may complete that entry, and an
// application that polled the completion found Err still nil (examples'
// TestSendRecvTooBig, 1 run in 5 under load).
func TestPeerTerminateErrBeforeCompletion(t *testing.T) {
	seen := make(chan error, 1)
	testHookPeerTerm = func(q *QP) { seen <- q.Err() }
	t.Cleanup(func() { testHookPeerTerm = nil })
	q, _, _, raw := tcpQP(t, Handed)

	h := wire.Header{Opcode: wire.OpTerminate, Last: true, DDPVersion: 1, RDMAPVersion: 1, QN: wire.OpTerminate.Info().QN, MSN: 1}
	term := wire.NewTerminate(wire.ErrRDMAPAccessRights, nil, 0, nil)
	u := append(h.Append(nil), term.Append(nil)...)
	b, err := wire.AppendFPDU(nil, u, false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := raw.Write(b); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-seen:
		if !errors.Is(err, ErrPeerTerminated) {
			t.Fatalf("Err while the Terminate's status is on the send queue: %v, want ErrPeerTerminated", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the peer's Terminate was not acted on")
	}
	if err := q.Err(); !errors.Is(err, ErrPeerTerminated) || !errors.Is(err, wire.ErrRDMAPAccessRights) {
		t.Fatalf("Err after: %v", err)
	}
}
