//go:build linux

package gowarp_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
)

// The kill-after-flush test: the responder is another process (this test
// binary, re-executed), killed with SIGKILL the moment the requester
// sees its flush complete; the file must then hold every byte written
// before the flush.
//
// What it can and cannot prove. SIGKILL ends the process, not the
// machine: the page cache that the responder's shared mapping writes into
// survives it, so a byte that was placed is in the file after the kill,
// whether or not it reached the disk. The test therefore proves what a
// visibility flush promises (every earlier Write was placed before the
// completion), and a persistence flush's msync runs on the way; that the
// pages reached stable storage only a machine crash (or a VM killed
// without a sync) could show, which this test cannot do. Without the
// flush, the requester's Write completions (Handed mode) only say the
// bytes were given to the local socket: a responder killed then can lose
// the ones it had not read yet, and the companion test counts how often.

const memsemChildEnv = "GOWARP_MEMSEM_CHILD"

// TestMemsemChild is the responder process; it runs only when re-executed.
func TestMemsemChild(t *testing.T) {
	path := os.Getenv(memsemChildEnv)
	if path == "" {
		t.Skip("the responder of TestFlushSurvivesKill; runs in a child process")
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	dev := gowarp.Open()
	pd := dev.AllocPD()
	mr, err := pd.RegisterFile(f, 0, 0, gowarp.RemoteWrite, gowarp.FileOptions{})
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	ln, err := dev.Listen("127.0.0.1:0")
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	cq := dev.NewCQ(16)
	qp, err := pd.NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq})
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	fmt.Println(ln.Addr(), mr.STag(), mr.Addr())
	req, err := ln.Accept(context.Background())
	if err == nil {
		err = req.Accept(context.Background(), qp, gowarp.ConnectOptions{})
	}
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	select {} // until killed
}

// killRun writes n Writes of w bytes to a responder process's file,
// flushes if asked, kills the responder at once and returns how many of
// the written bytes the file lacks.
func killRun(t *testing.T, n, w int, doFlush bool, typ gowarp.FlushType) int {
	t.Helper()
	path := newFile(t, n*w).Name()
	cmd, addr, stag, base := startPeer(t, "TestMemsemChild", memsemChildEnv+"="+path)
	p := newIdlePair(t, 1024)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.a.Connect(ctx, addr, gowarp.ConnectOptions{}); err != nil {
		t.Fatal(err)
	}
	defer p.a.Close()
	src, sbuf := p.reg(t, n*w, gowarp.LocalWrite)
	copy(sbuf, pattern(n*w, 11))
	for i := range n {
		if err := p.a.PostSend(&gowarp.SendWR{ID: uint64(i), Op: gowarp.OpWrite, Flags: gowarp.Signaled,
			SGL: []gowarp.SGE{{MR: src, Offset: i * w, Length: w}}, RemoteAddr: base + uint64(i*w), RKey: gowarp.STag(stag)}); err != nil {
			t.Fatal(err)
		}
	}
	want := n
	if doFlush {
		if err := p.a.PostFlush(&gowarp.FlushWR{ID: 1 << 40, Flags: gowarp.Signaled, Type: typ, RKey: gowarp.STag(stag)}); err != nil {
			t.Fatal(err)
		}
		want++
	}
	for range want {
		if c := wait(t, p.acq); c.Err() != nil {
			t.Fatalf("%v %d: %v", c.Op, c.ID, c.Err())
		}
	}
	cmd.Process.Kill() // the moment the last completion is seen
	cmd.Wait()
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lost := 0
	for i := range got {
		if got[i] != sbuf[i] {
			lost++
		}
	}
	return lost
}

// TestFlushSurvivesKill: after a flush completes, a responder killed
// with SIGKILL has every byte written before it in its file.
func TestFlushSurvivesKill(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	for i, typ := range []gowarp.FlushType{gowarp.FlushVisibility, gowarp.FlushPersistence, gowarp.FlushVisibility, gowarp.FlushPersistence} {
		if lost := killRun(t, 32, 256<<10, true, typ); lost != 0 {
			t.Fatalf("run %d (%v): %d bytes written before the flush are not in the file", i, typ, lost)
		}
	}
}

// TestNoFlushCanLose: the same runs without the flush, to show what the
// flush adds: the Write completions alone do not mean the responder
// placed the bytes. Whether a run loses some depends on scheduling, so
// the test reports and asserts nothing about it.
func TestNoFlushCanLose(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	runs, lossy := 4, 0
	for range runs {
		if lost := killRun(t, 32, 256<<10, false, 0); lost > 0 {
			lossy++
			t.Logf("%d of %d bytes lost", lost, 32*256<<10)
		}
	}
	t.Logf("%d of %d runs without a flush lost bytes", lossy, runs)
}
