package cache

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
)

func sampleBuckets() [][]byte {
	var out [][]byte
	for _, e := range []idxEntry{
		{seq: 1, gen: 7, size: 4096, addr: Addr{STag: 0x1201, Off: 1<<32 + 64, Len: 4096}, key: []byte("k")},
		{seq: 9, gen: 1 << 40, size: 0, addr: Addr{STag: 0xffffff01, Off: 5 << 32, Len: 0}, key: bytes.Repeat([]byte("x"), idxKeyMax)},
	} {
		b := make([]byte, idxBucketLen)
		putBucket(b, &e)
		out = append(out, b)
	}
	return append(out, make([]byte, idxBucketLen))
}

// TestBucketRoundTrip: an entry reads back as written; an empty bucket is
// empty; every mix of two buckets (a torn read: the first k bytes of one,
// the rest of the other) and every flipped bit is torn, never an entry.
func TestBucketRoundTrip(t *testing.T) {
	bs := sampleBuckets()
	var e idxEntry
	if got := parseBucket(bs[0], &e); got != bucketEntry || e.gen != 7 || string(e.key) != "k" || e.addr.Len != 4096 || e.addr.Off != 1<<32+64 {
		t.Fatalf("parse: %d, %+v", got, e)
	}
	if got := parseBucket(bs[2], &e); got != bucketEmpty {
		t.Fatalf("zero bucket: %d", got)
	}
	for _, pair := range [][2]int{{0, 1}, {1, 0}, {0, 2}, {2, 0}, {1, 2}, {2, 1}} {
		a, b := bs[pair[0]], bs[pair[1]]
		for k := 1; k < idxBucketLen; k++ {
			mix := append(append([]byte(nil), a[:k]...), b[k:]...)
			if bytes.Equal(mix, a) || bytes.Equal(mix, b) {
				continue
			}
			if got := parseBucket(mix, &e); got == bucketEntry {
				t.Fatalf("%d bytes of bucket %d, then bucket %d: an entry %+v", k, pair[0], pair[1], e)
			}
		}
	}
	for bit := range idxBucketLen * 8 {
		b := append([]byte(nil), bs[0]...)
		b[bit/8] ^= 1 << (bit % 8)
		if got := parseBucket(b, &e); got != bucketTorn {
			t.Fatalf("bit %d flipped: %d", bit, got)
		}
	}
	// findBucket: the key's entry among others, torn only when not found.
	nb := append(append(append(append([]byte(nil), bs[1]...), bs[2]...), bs[0]...), bs[2]...)
	if x, found, torn := findBucket(nb, []byte("k")); !found || torn || x.gen != 7 {
		t.Fatalf("find k: %+v %v %v", x, found, torn)
	}
	if _, found, torn := findBucket(nb, []byte("other")); found || torn {
		t.Fatalf("find other: %v %v", found, torn)
	}
	nb[idxBucketLen*2+60] ^= 1
	if _, found, torn := findBucket(nb, []byte("k")); found || !torn {
		t.Fatalf("find k in a torn bucket: %v %v", found, torn)
	}
}

// FuzzBucket: the decoder of index buckets, which clients read from the
// server's memory, never panics, and what it accepts re-encodes to the
// same bytes.
func FuzzBucket(f *testing.F) {
	for _, b := range sampleBuckets() {
		f.Add(b, []byte("k"))
	}
	f.Add([]byte{1, 2, 3}, []byte("k"))
	f.Fuzz(func(t *testing.T, b, key []byte) {
		var e idxEntry
		if parseBucket(b, &e) == bucketEntry {
			again := make([]byte, idxBucketLen)
			putBucket(again, &e)
			if !bytes.Equal(again, b[:idxBucketLen]) {
				t.Fatalf("bucket %x re-encodes as %x", b[:idxBucketLen], again)
			}
		}
		_, _, _ = findBucket(b, key)
	})
}

// FuzzHello: the decoder of the connection's private data (the client's
// offer, the server's answer with its index) never panics and accepts no
// index it could not read.
func FuzzHello(f *testing.F) {
	f.Add(hello{Version: Version, Slots: 4, MaxMsg: maxMsg}.append(nil))
	f.Add(hello{Version: Version, Slots: 32, MaxMsg: maxMsg, BlockSize: 4 << 20, MaxValue: 64 << 20,
		IdxVersion: idxVersion, IdxSTag: 0x301, IdxAddr: 0x1000, IdxBuckets: 1 << 16}.append(nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := parseHello(b)
		if err != nil || h.IdxVersion == 0 {
			return
		}
		if n := h.IdxBuckets; n == 0 || n&(n-1) != 0 || h.IdxAddr+uint64(n+idxProbe)*idxBucketLen < h.IdxAddr {
			t.Fatalf("accepted index %+v", h)
		}
	})
}

// TestIndexForgedEntry: an index entry whose checksum holds but whose
// generation is not the piece's (a stale entry, or a forged one) yields
// no bytes of it: the client's read fails the piece's header check, and
// the control path then serves the right value. An entry naming another
// key's piece under this key's generation fails the same way.
func TestIndexForgedEntry(t *testing.T) {
	addr, srv := serveT(t, ServerOptions{})
	dev := gowarp.Open(gowarp.WithLogger(discard))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := Dial(ctx, addr, ClientOptions{Device: dev, Logger: discard, Lookup: LookupIndex})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	a, b := bytes.Repeat([]byte("a"), 3000), bytes.Repeat([]byte("b"), 3000)
	if err := c.Put(ctx, "a", a, PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.Put(ctx, "b", b, PutOptions{}); err != nil {
		t.Fatal(err)
	}
	st := srv.st
	st.mu.Lock()
	ia, ib := st.idx.where["a"], st.idx.where["b"]
	var ea, eb idxEntry
	parseBucket(st.idx.b[ia*idxBucketLen:], &ea)
	parseBucket(st.idx.b[ib*idxBucketLen:], &eb)
	st.mu.Unlock()
	for _, forged := range []idxEntry{
		{seq: 100, gen: ea.gen + 1000, size: ea.size, addr: ea.addr, key: []byte("a")}, // another generation
		{seq: 101, gen: ea.gen, size: eb.size, addr: eb.addr, key: []byte("a")},        // b's piece as a's
	} {
		st.mu.Lock()
		putBucket(st.idx.b[ia*idxBucketLen:], &forged)
		st.mu.Unlock()
		gets := srv.Stats().Gets
		got, err := c.Get(ctx, "a")
		if err != nil || !bytes.Equal(got, a) {
			t.Fatalf("get through forged entry %+v: %q…, %v", forged, got[:min(len(got), 8)], err)
		}
		if srv.Stats().Gets != gets+1 {
			t.Fatalf("the control path was not asked: gets %d → %d", gets, srv.Stats().Gets)
		}
		mr, _ := c.PD().Register(make([]byte, 3000), gowarp.LocalWrite)
		if n, err := c.ReadAt(ctx, "a", mr, 0, 3000, 0); err != nil || !bytes.Equal(mr.Bytes()[:n], a) {
			t.Fatalf("ReadAt through forged entry: %d, %v", n, err)
		}
		c.forget("a")
		mr.Deregister()
	}
	// A torn bucket: the control path answers.
	st.mu.Lock()
	binary.BigEndian.PutUint64(st.idx.b[ia*idxBucketLen+16:], 12345)
	st.mu.Unlock()
	if got, err := c.Get(ctx, "a"); err != nil || !bytes.Equal(got, a) {
		t.Fatalf("get through a torn bucket: %v", err)
	}
	if got, err := c.Get(ctx, "b"); err != nil || !bytes.Equal(got, b) {
		t.Fatalf("get b: %v", err)
	}
	if _, err := c.Get(ctx, "none"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("get of a missing key: %v", err)
	}
}
