package engine

import (
	"context"
	"errors"
	"os"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gowarp/gowarp/internal/cm"
	"github.com/gowarp/gowarp/internal/mem"
	"golang.org/x/sys/unix"
)

// TestSpinnerRingsParked: on one processor, a reader that spins (its
// peer sends nothing) is always something for the scheduler to run, so
// the Go runtime polls the network only from sysmon, every 10 ms: a
// reader that went to the netpoller and whose bytes came meanwhile waits
// that long unless the spinner wakes it. The spinner must ring it (its
// read ends at the doorbell, the deadline) within its first looks at the
// parked readers. A try may lose to sysmon on a loaded host, so it takes
// one ring in three tries, not counting those where sysmon handed the
// parked reader its byte before the spinner looked.
func TestSpinnerRingsParked(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	var bDone chan error
	var spinner *fdLink
	var spinnerPeer interface{ Write([]byte) (int, error) }
	yields := 0
	spinner, p := spinLink(t, func() {
		yields++
		select {
		case err := <-bDone:
			bDone <- err
			spinnerPeer.Write([]byte("x")) // the spinner's own bytes end its spin
			waitInqBusy(spinner, 1, nil)
		default:
		}
		runtime.Gosched()
	}, true)
	spinnerPeer = p
	spinner.spinFor = time.Hour
	rung, lost := 0, 0
	for try := 0; try < 3+lost && lost < 20 && rung == 0; try++ {
		a, b := tcpPair(t)
		parkedLink := NewLink(b).(*fdLink)
		var bell atomic.Bool
		parkedLink.setBusyPoll(time.Microsecond, &bell, nil)
		ib := &idleBufs{put: make(chan []byte, 1), got: make([]byte, 64)}
		bDone = make(chan error, 1)
		go func() {
			_, _, err := parkedLink.ReadIdle(make([]byte, 64), ib.give, ib.take, nil)
			bDone <- err
		}()
		<-ib.put // it waits in the netpoller, armed
		if !parkedLink.parked.Load() {
			t.Fatal("a busy-polling reader went to the netpoller unwatched")
		}
		a.Write([]byte("y"))
		// Without parking: the netpoller must not run. Sysmon's may, and
		// the parked reader then take the byte before the spinner looks:
		// that try is lost to sysmon.
		if !waitInqBusy(parkedLink, 1, func() bool { return len(bDone) > 0 }) {
			if len(bDone) == 0 {
				t.Fatal("the byte written never reached the parked reader's socket")
			}
			lost++
			if err := <-bDone; err != nil {
				t.Fatalf("the parked reader, woken by sysmon: %v", err)
			}
			parkedLink.Close()
			continue
		}
		yields = 0
		if n, _, err := spinner.ReadIdle(make([]byte, 64), func([]byte) {}, func() []byte { return make([]byte, 64) }, nil); err != nil || n != 1 {
			t.Fatalf("the spinner read %d, %v", n, err)
		}
		err := <-bDone
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded) && bell.Load():
			rung++
		case err != nil:
			t.Fatalf("the parked reader: %v", err)
		}
		parkedLink.Close()
		if parkedLink.parked.Load() || parkedLink.wfd != -1 {
			t.Fatal("a closed link is still watched")
		}
	}
	if rung == 0 {
		t.Fatalf("the spinner never rang the parked reader whose bytes came (%d yields in the last try, %d tries lost to sysmon first): it waited for sysmon", yields, lost)
	}
}

// waitInqBusy waits, without parking the goroutine, until l's socket
// holds n bytes, and reports true; or reports false once gone (if not
// nil) says the bytes went to a reader instead. A minute bounds it.
func waitInqBusy(l *fdLink, n int, gone func() bool) bool {
	end := time.Now().Add(time.Minute)
	for inq := 0; inq < n; {
		if gone != nil && gone() || time.Now().After(end) {
			return false
		}
		l.rc.Control(func(fd uintptr) { inq, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ) })
	}
	return true
}

// TestParkedForgotten: a busy-polling queue pair's link leaves the watch
// as it closes, whether its side closes it or its peer goes: 40 pairs,
// each side parked first, leave no link behind.
func TestParkedForgotten(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	newQP := func() *QP {
		cq := NewCQ(16)
		q, err := NewQP(Config{SendDepth: 8, RecvDepth: 8, SendCQ: cq, RecvCQ: cq, PD: 1, Table: mem.NewTable()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { q.Close() })
		return q
	}
	opts := ConnectOptions{BusyPoll: 20 * time.Microsecond}
	var links []*fdLink
	for i := range 40 {
		ini, rsp := newQP(), newQP()
		a, b := tcpPair(t)
		errc := make(chan error, 1)
		go func() {
			req, err := cm.ReadRequest(ctx, b)
			if err == nil {
				err = rsp.Accept(ctx, req, opts)
			}
			errc <- err
		}()
		if err := ini.ConnectConn(ctx, a, opts); err != nil {
			t.Fatal(err)
		}
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		li, lr := ini.link.(*fdLink), rsp.link.(*fdLink)
		for !li.parked.Load() || !lr.parked.Load() {
			if ctx.Err() != nil {
				t.Fatal("the idle links did not park")
			}
			time.Sleep(time.Millisecond)
		}
		links = append(links, li, lr)
		if i%2 == 0 {
			ini.Close() // both go: this side closes, the peer sees it
		} else {
			a.Close() // the connection goes under both
		}
	}
	for _, l := range links {
		for {
			parked.mu.Lock()
			watched := l.wfd >= 0 || parked.links[int32(l.wfd)] == l
			parked.mu.Unlock()
			if !watched && !l.parked.Load() {
				break
			}
			if ctx.Err() != nil {
				t.Fatal("a link whose queue pair ended is still watched")
			}
			time.Sleep(time.Millisecond)
		}
	}
	parked.mu.Lock()
	defer parked.mu.Unlock()
	for _, l := range parked.links {
		for _, m := range links {
			if l == m {
				t.Fatal("the watch still holds a closed link")
			}
		}
	}
}
