package engine

import (
	"testing"
	"time"
)

// TestHoldTx: a responder without peer-to-peer mode holds its first FPDU
// for the initiator's; with SendFirst only for SendFirstDelay (20 ms by
// default), or not at all when that is negative; initiators never hold.
func TestHoldTx(t *testing.T) {
	for _, tc := range []struct {
		hold      bool
		o         ConnectOptions
		wantHold  bool
		wantAfter time.Duration
	}{
		{false, ConnectOptions{}, false, 0},
		{false, ConnectOptions{SendFirst: true, SendFirstDelay: time.Second}, false, 0},
		{true, ConnectOptions{}, true, 0},
		{true, ConnectOptions{SendFirstDelay: time.Second}, true, 0},
		{true, ConnectOptions{SendFirst: true}, true, sendFirstDelay},
		{true, ConnectOptions{SendFirst: true, SendFirstDelay: time.Second}, true, time.Second},
		{true, ConnectOptions{SendFirst: true, SendFirstDelay: -1}, false, 0},
	} {
		hold, after := holdTx(tc.hold, &tc.o)
		if hold != tc.wantHold || after != tc.wantAfter {
			t.Errorf("holdTx(%v, SendFirst %v, SendFirstDelay %v) = %v, %v; want %v, %v",
				tc.hold, tc.o.SendFirst, tc.o.SendFirstDelay, hold, after, tc.wantHold, tc.wantAfter)
		}
	}
}
