package wire

import (
	"bytes"
	"testing"
)

// The RFC 7306 bodies, byte by byte as the RFC lays them out (§4.1,
// §5.2.1, §5.2.2): big-endian fields in order, the Atomic Operation code
// in the low nibble of the first word.
func TestExtBodies(t *testing.T) {
	req := AtomicRequest{Op: AtomicCmpSwap, ReqID: 0x01020304, RemoteSTag: 0xa1b2c3d4, RemoteTO: 0x1122334455667788,
		AddSwap: 0x99, AddSwapMask: ^uint64(0), Compare: 0x42, CompareMask: 0xffff}
	want := []byte{0, 0, 0, 1, 1, 2, 3, 4, 0xa1, 0xb2, 0xc3, 0xd4, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88,
		0, 0, 0, 0, 0, 0, 0, 0x99, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
		0, 0, 0, 0, 0, 0, 0, 0x42, 0, 0, 0, 0, 0, 0, 0xff, 0xff}
	b := req.Append(nil)
	if !bytes.Equal(b, want) || len(b) != AtomicRequestLen {
		t.Fatalf("Atomic Request\n got % x\nwant % x", b, want)
	}
	got, n, err := ParseAtomicRequest(append(b, 0xee))
	if err != nil || n != AtomicRequestLen || got != req {
		t.Fatalf("ParseAtomicRequest = %+v, %d, %v", got, n, err)
	}
	if _, _, err := ParseAtomicRequest(b[:AtomicRequestLen-1]); err != ErrULPDUTooShort {
		t.Fatalf("short Atomic Request: %v", err)
	}

	resp := AtomicResponse{ReqID: 7, Original: 0x0102030405060708}
	b = resp.Append(nil)
	if want := []byte{0, 0, 0, 7, 1, 2, 3, 4, 5, 6, 7, 8}; !bytes.Equal(b, want) {
		t.Fatalf("Atomic Response % x", b)
	}
	if got, n, err := ParseAtomicResponse(b); err != nil || n != AtomicResponseLen || got != resp {
		t.Fatalf("ParseAtomicResponse = %+v, %d, %v", got, n, err)
	}
	if _, _, err := ParseAtomicResponse(b[:11]); err != ErrULPDUTooShort {
		t.Fatalf("short Atomic Response: %v", err)
	}

	b = AppendImmediate(nil, 0xdeadbeef)
	if want := []byte{0, 0, 0, 0, 0xde, 0xad, 0xbe, 0xef}; !bytes.Equal(b, want) {
		t.Fatalf("Immediate Data % x", b)
	}
	if v, n, err := ParseImmediate(b); err != nil || n != ImmediateLen || v != 0xdeadbeef {
		t.Fatalf("ParseImmediate = %#x, %d, %v", v, n, err)
	}
	if _, _, err := ParseImmediate(b[:7]); err != ErrULPDUTooShort {
		t.Fatalf("short Immediate Data: %v", err)
	}
	if !AtomicFetchAdd.Valid() || !AtomicCmpSwap.Valid() || AtomicOp(2).Valid() {
		t.Fatal("AtomicOp.Valid")
	}
}

func FuzzParseAtomicRequest(f *testing.F) {
	f.Add((&AtomicRequest{Op: AtomicFetchAdd, ReqID: 1, RemoteSTag: 0x5c2eac00, RemoteTO: 0x562cae9f5440, AddSwap: 1}).Append(nil))
	f.Add((&AtomicRequest{Op: AtomicCmpSwap, Reserved: 0xfffffff, ReqID: ^uint32(0), AddSwap: 2, Compare: 1,
		AddSwapMask: ^uint64(0), CompareMask: ^uint64(0)}).Append(nil))
	f.Add(make([]byte, AtomicRequestLen-1))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, n, err := ParseAtomicRequest(b)
		if err != nil {
			if err != ErrULPDUTooShort || n != 0 || len(b) >= AtomicRequestLen {
				t.Fatalf("%v with %d bytes consumed of %d", err, n, len(b))
			}
			return
		}
		if n != AtomicRequestLen || n > len(b) {
			t.Fatalf("consumed %d of %d", n, len(b))
		}
		if enc := r.Append(nil); !bytes.Equal(enc, b[:n]) {
			t.Fatalf("re-encoded\n got % x\nwant % x", enc, b[:n])
		}
	})
}

func FuzzParseAtomicResponse(f *testing.F) {
	f.Add((&AtomicResponse{ReqID: 1, Original: 41}).Append(nil))
	f.Add((&AtomicResponse{ReqID: ^uint32(0), Original: ^uint64(0)}).Append(nil))
	f.Add(make([]byte, AtomicResponseLen-1))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, n, err := ParseAtomicResponse(b)
		if err != nil {
			if err != ErrULPDUTooShort || n != 0 || len(b) >= AtomicResponseLen {
				t.Fatalf("%v with %d bytes consumed of %d", err, n, len(b))
			}
			return
		}
		if n != AtomicResponseLen || n > len(b) {
			t.Fatalf("consumed %d of %d", n, len(b))
		}
		if enc := r.Append(nil); !bytes.Equal(enc, b[:n]) {
			t.Fatalf("re-encoded\n got % x\nwant % x", enc, b[:n])
		}
	})
}

func FuzzParseImmediate(f *testing.F) {
	f.Add(AppendImmediate(nil, 0xdeadbeef))
	f.Add(AppendImmediate(nil, ^uint64(0)))
	f.Add(make([]byte, ImmediateLen-1))
	f.Fuzz(func(t *testing.T, b []byte) {
		v, n, err := ParseImmediate(b)
		if err != nil {
			if err != ErrULPDUTooShort || n != 0 || len(b) >= ImmediateLen {
				t.Fatalf("%v with %d bytes consumed of %d", err, n, len(b))
			}
			return
		}
		if n != ImmediateLen {
			t.Fatalf("consumed %d of %d", n, len(b))
		}
		if enc := AppendImmediate(nil, v); !bytes.Equal(enc, b[:n]) {
			t.Fatalf("re-encoded\n got % x\nwant % x", enc, b[:n])
		}
	})
}
