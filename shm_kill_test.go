//go:build linux

package gowarp_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
)

// The kill test: the peer of a shared-memory link is another process
// (this test binary, re-executed), streaming Writes to us while we stream
// Writes to it, killed with SIGKILL in the middle.

const shmChildEnv = "GOWARP_SHM_CHILD"

// TestAdapterSharedMemoryChild is the peer process; it runs only when
// re-executed by TestAdapterSharedMemoryKill.
func TestAdapterSharedMemoryChild(t *testing.T) {
	if os.Getenv(shmChildEnv) == "" {
		t.Skip("the peer of TestAdapterSharedMemoryKill; runs in a child process")
	}
	fail := func(err error) {
		fmt.Println("error", err)
		os.Exit(1)
	}
	dev := gowarp.Open()
	pd := dev.AllocPD()
	buf := make([]byte, 1<<20)
	mr, err := pd.Register(buf, gowarp.RemoteWrite)
	if err != nil {
		fail(err)
	}
	ln, err := dev.Listen("127.0.0.1:0")
	if err != nil {
		fail(err)
	}
	cq := dev.NewCQ(256)
	qp, err := pd.NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq})
	if err != nil {
		fail(err)
	}
	fmt.Println(ln.Addr(), mr.STag(), mr.Addr())
	ctx := context.Background()
	req, err := ln.Accept(ctx)
	if err != nil {
		fail(err)
	}
	pdata := req.PrivateData()
	if err := req.Accept(ctx, qp, gowarp.ConnectOptions{SharedMemory: true}); err != nil {
		fail(err)
	}
	if len(pdata) != 12 {
		fail(fmt.Errorf("private data %q", pdata))
	}
	stag, addr := binary.BigEndian.Uint32(pdata), binary.BigEndian.Uint64(pdata[4:])
	// Stream Writes back until killed.
	// From a region of its own: the peer's Writes land in mr meanwhile.
	src, err := pd.Register(make([]byte, 64<<10), 0)
	if err != nil {
		fail(err)
	}
	wr := gowarp.SendWR{Op: gowarp.OpWrite, SGL: []gowarp.SGE{{MR: src, Length: 64 << 10}}, RemoteAddr: addr, RKey: gowarp.STag(stag)}
	var wc [16]gowarp.Completion
	for i := 0; ; i++ {
		wr.Flags = 0
		if i%16 == 15 {
			wr.Flags = gowarp.Signaled
		}
		if err := qp.PostSend(&wr); err != nil {
			if !errors.Is(err, gowarp.ErrQueueFull) {
				fail(err)
			}
			cq.Wait(ctx)
			cq.Poll(wc[:])
		}
	}
}

// startPeer re-executes this test binary to run only the test named run,
// with env set in its environment, and returns the process and what it
// printed first: its listening address and an MR's STag and address.
// The process is killed and waited for when the test ends.
func startPeer(t *testing.T, run, env string) (cmd *exec.Cmd, addr string, stag uint32, base uint64) {
	t.Helper()
	cmd = exec.Command(os.Args[0], "-test.run=^"+run+"$")
	cmd.Env = append(os.Environ(), env)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	// A child that never says where it listens must fail the test, not
	// hang it: the read is bounded (the cleanup kills the child, which
	// ends it).
	type said struct {
		line string
		err  error
	}
	c := make(chan said, 1)
	go func() {
		line, err := bufio.NewReader(out).ReadString('\n')
		c <- said{line, err}
	}()
	var line string
	select {
	case s := <-c:
		if s.err != nil {
			t.Fatalf("child: %v", s.err)
		}
		line = s.line
	case <-time.After(30 * time.Second):
		t.Fatal("child: no address in 30 s")
	}
	if _, err := fmt.Sscan(line, &addr, &stag, &base); err != nil {
		t.Fatalf("child said %q: %v", line, err)
	}
	return cmd, addr, stag, base
}

// TestAdapterSharedMemoryKill: a peer process killed with SIGKILL in the
// middle of two streams of Writes makes the queue pair fail with a clear
// error (the peer closed, or the link was lost), every work request
// posted completes (done or flushed), nothing hangs, and no file is left
// in /dev/shm.
func TestAdapterSharedMemoryKill(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	for run := range 2 {
		cmd, addr, stag, base := startPeer(t, "TestAdapterSharedMemoryChild", shmChildEnv+"=1")
		p := newIdlePair(t, 1024)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		dst, _ := p.reg(t, 64<<10, gowarp.RemoteWrite)
		pdata := binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint32(nil, uint32(dst.STag())), dst.Addr())
		if err := p.a.Connect(ctx, addr, gowarp.ConnectOptions{SharedMemory: true, PrivateData: pdata}); err != nil {
			t.Fatal(err)
		}
		if p.a.Transport() != gowarp.TransportSharedMemory {
			t.Fatalf("transport %v", p.a.Transport())
		}
		src, _ := p.reg(t, 64<<10, 0)
		wr := gowarp.SendWR{Op: gowarp.OpWrite, Flags: gowarp.Signaled, SGL: []gowarp.SGE{{MR: src, Length: 64 << 10}}, RemoteAddr: base, RKey: gowarp.STag(stag)}
		posted, completed, flushed := 0, 0, 0
		var wc [64]gowarp.Completion
		poll := func() {
			n := p.acq.Poll(wc[:])
			for _, c := range wc[:n] {
				completed++
				if c.Status == gowarp.WRFlushError {
					flushed++
				} else if c.Err() != nil {
					t.Errorf("completion %+v", c)
				}
			}
		}
		killed := false
		for ctx.Err() == nil {
			if !killed && completed >= 200 && dst.Placed() >= 4<<20 {
				// Both streams flow: kill the peer with work outstanding.
				cmd.Process.Kill()
				killed = true
			}
			if posted-completed < 100 {
				if err := p.a.PostSend(&wr); err == nil {
					posted++
					continue
				} else if !errors.Is(err, gowarp.ErrQueueFull) {
					if !killed {
						t.Fatalf("post before the kill: %v", err)
					}
					break
				}
			}
			poll()
			if completed < posted {
				p.acq.Wait(ctx)
			}
		}
		for completed < posted && ctx.Err() == nil {
			p.acq.Wait(ctx)
			poll()
		}
		if ctx.Err() != nil {
			t.Fatalf("run %d: hung: %d posted, %d completed, state %v", run, posted, completed, p.a.State())
		}
		waitState(t, p.a, gowarp.StateError)
		err := p.a.Err()
		if !errors.Is(err, gowarp.ErrPeerClosed) && !errors.Is(err, gowarp.ErrLinkLost) {
			t.Fatalf("run %d: error %v, want ErrPeerClosed or ErrLinkLost", run, err)
		}
		t.Logf("run %d: %d posted, %d flushed, %d MiB received; %v", run, posted, flushed, dst.Placed()>>20, err)
		cmd.Wait()
		p.a.Close()
		if f := shmFiles(t, cmd.Process.Pid); len(f) != 0 {
			t.Fatalf("files left in /dev/shm: %v", f)
		}
	}
}
