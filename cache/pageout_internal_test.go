//go:build linux

package cache

import (
	"bytes"
	"context"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TestPageOutDropsPages: a block paged out leaves the page cache (the
// pager writes it back and drops it), and its value still reads back.
func TestPageOutDropsPages(t *testing.T) {
	const bs = 256 << 10
	addr, srv := serveT(t, ServerOptions{BlockSize: bs, Budget: bs})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl, err := Dial(ctx, addr, ClientOptions{Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	vals := make([][]byte, 3)
	for i := range vals {
		vals[i] = bytes.Repeat([]byte{byte(i + 1)}, bs-HeaderLen)
		if err := cl.Put(ctx, string(rune('a'+i)), vals[i], PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	srv.st.mu.Lock()
	mem, outs := srv.st.blocks[0].mr.Bytes(), srv.st.pageOuts
	srv.st.mu.Unlock()
	if outs == 0 {
		t.Fatal("no block was paged out")
	}
	vec := make([]byte, len(mem)/unix.Getpagesize())
	resident := func() int {
		// x/sys has no Mincore.
		_, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&mem[0])), uintptr(len(mem)), uintptr(unsafe.Pointer(&vec[0])))
		if e != 0 {
			t.Fatal(e)
		}
		n := 0
		for _, v := range vec {
			n += int(v & 1)
		}
		return n
	}
	n := resident()
	for end := time.Now().Add(10 * time.Second); n > 0 && time.Now().Before(end); n = resident() {
		time.Sleep(5 * time.Millisecond)
	}
	if n > 0 {
		t.Fatalf("%d of block 0's %d pages still in memory after its page-out", n, len(vec))
	}
	got, err := cl.Get(ctx, "a")
	if err != nil || !bytes.Equal(got, vals[0]) {
		t.Fatalf("the paged-out value reads back wrong: %d bytes, %v", len(got), err)
	}
}
