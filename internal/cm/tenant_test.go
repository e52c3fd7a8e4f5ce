package cm

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/gowarp/gowarp/wire"
)

// accepted is what the responder's side of an exchange ended with.
type accepted struct {
	req *Request
	res Result
	err error
}

// acceptAsync runs the responder's side on c, reading the request and
// accepting it with o, and sends what it ended with.
func acceptAsync(ctx context.Context, c net.Conn, o Options) <-chan accepted {
	done := make(chan accepted, 1)
	go func() {
		req, err := readRequest(ctx, c)
		if err != nil {
			done <- accepted{err: err}
			return
		}
		res, err := req.Accept(ctx, o)
		done <- accepted{req, res, err}
	}()
	return done
}

// TestTenantCarried: a tenant name reaches the responder, is confirmed,
// and neither application sees the block, with the extensions' block
// beside it or not; without a name nothing is added either way.
func TestTenantCarried(t *testing.T) {
	for _, tt := range []struct {
		name   string
		tenant string
		ext    bool
		rev    int
	}{
		{"tenant", "acme", false, 2}, {"tenant and ext", "acme-2:prod", true, 2},
		{"tenant rev 1", "a", false, 1}, {"longest", strings.Repeat("x", MaxTenantLen), true, 2},
		{"none", "", true, 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			a, b := net.Pipe()
			defer a.Close()
			defer b.Close()
			done := acceptAsync(ctx, b, Options{Ext: true, PrivateData: []byte("reply")})
			res, err := Initiate(ctx, a, Options{Revision: tt.rev, Ext: tt.ext, Tenant: tt.tenant, PrivateData: []byte("request")})
			if err != nil {
				t.Fatal(err)
			}
			o := <-done
			if o.err != nil {
				t.Fatal(o.err)
			}
			if o.req.Tenant() != tt.tenant || res.Ext != tt.ext || o.res.Ext != tt.ext {
				t.Errorf("tenant %q, ext %v/%v; want %q, %v", o.req.Tenant(), res.Ext, o.res.Ext, tt.tenant, tt.ext)
			}
			if string(res.PrivateData) != "reply" || string(o.req.PrivateData()) != "request" {
				t.Errorf("private data %q / %q", res.PrivateData, o.req.PrivateData())
			}
		})
	}
}

// TestTenantNotSentUnasked: without a tenant name, the request carries
// no block; a responder answers with none to a request that had none.
func TestTenantNotSentUnasked(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a, b := net.Pipe()
	defer a.Close()
	go Initiate(ctx, a, Options{PrivateData: []byte("x"), Ext: true})
	f, err := readFrame(b)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(f.PrivateData, tenantMagic[:]) {
		t.Fatalf("request carries a tenant block: % x", f.PrivateData)
	}
	a.Close()
	b.Close()
	// A responder, to a raw request without a block.
	a, b = net.Pipe()
	defer a.Close()
	defer b.Close()
	go func() {
		if req, err := readRequest(ctx, b); err == nil {
			req.Accept(ctx, Options{Ext: true, PrivateData: []byte("y")})
		}
	}()
	if err := writeFrame(a, &wire.MPAFrame{Revision: 2, Enhanced: true, IRD: 1, ORD: 1, PrivateData: []byte("z")}); err != nil {
		t.Fatal(err)
	}
	rep, err := readFrame(a)
	if err != nil {
		t.Fatal(err)
	}
	if string(rep.PrivateData) != "y" {
		t.Fatalf("reply's private data % x, want only the application's", rep.PrivateData)
	}
}

// TestTenantRefused: an initiator whose name the reply does not confirm
// (a responder that knows no tenants) fails with ErrTenantRefused.
func TestTenantRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	go func() {
		f, err := readFrame(b)
		if err != nil {
			return
		}
		writeFrame(b, &wire.MPAFrame{Reply: true, Revision: 2, Enhanced: true, IRD: f.ORD, ORD: f.IRD, P2P: true, RTR: wire.RTRWrite})
	}()
	_, err := Initiate(ctx, a, Options{Tenant: "acme"})
	if !errors.Is(err, ErrTenantRefused) {
		t.Fatalf("Initiate: %v", err)
	}
}

// TestBadTenant: names too long, empty where given, or with bytes other
// than printable ASCII are refused before anything is sent; a request
// whose block is malformed is refused as a protocol error.
func TestBadTenant(t *testing.T) {
	for _, name := range []string{strings.Repeat("x", MaxTenantLen+1), "a b", "tab\t", "ü", "\x00"} {
		if err := (&Options{Revision: 2, Tenant: name}).check(); !errors.Is(err, ErrBadTenant) {
			t.Errorf("tenant %q: %v", name, err)
		}
	}
	long := Options{Revision: 2, Tenant: "acme", PrivateData: make([]byte, wire.MaxMPAPrivateData-4-8)}
	if err := long.check(); !errors.Is(err, ErrPrivateDataLong) {
		t.Errorf("private data and tenant over the limit: %v", err)
	}
	for _, pd := range [][]byte{
		append([]byte{0}, tenantMagic[:]...),                    // zero length
		append([]byte("ab\x05"), tenantMagic[:]...),             // longer than the data
		append([]byte("a b\x03"), tenantMagic[:]...),            // a space
		append(append(make([]byte, 70), 70), tenantMagic[:]...), // too long
	} {
		if _, _, err := CutTenant(pd); !errors.Is(err, ErrBadTenant) {
			t.Errorf("block % x: %v", pd, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		a, b := net.Pipe()
		go func() {
			writeFrame(a, &wire.MPAFrame{Revision: 2, Enhanced: true, PrivateData: pd})
			readFrame(a) // the rejection
		}()
		if _, err := readRequest(ctx, b); !errors.Is(err, ErrProtocol) || !errors.Is(err, ErrBadTenant) {
			t.Errorf("request with block % x: %v", pd, err)
		}
		a.Close()
		b.Close()
		cancel()
	}
}

// FuzzCutTenant: CutTenant never panics; what it takes is a valid name
// and the rest of the data, and appending the name back gives the input.
func FuzzCutTenant(f *testing.F) {
	f.Add(appendTenant([]byte("private"), "acme"))
	f.Add(appendTenant(nil, strings.Repeat("z", MaxTenantLen)))
	f.Add(appendExt(appendTenant([]byte{1, 2}, "t")))
	f.Add(append([]byte{200}, tenantMagic[:]...))
	f.Add([]byte("no block"))
	f.Fuzz(func(t *testing.T, pd []byte) {
		rest, name, err := CutTenant(pd)
		switch {
		case err != nil:
			if !errors.Is(err, ErrBadTenant) {
				t.Fatalf("error %v", err)
			}
		case name == "":
			if !bytes.Equal(rest, pd) {
				t.Fatal("no name, yet the data changed")
			}
		default:
			if CheckTenant(name) != nil || !bytes.Equal(appendTenant(rest, name), pd) {
				t.Fatalf("name %q, rest % x from % x", name, rest, pd)
			}
		}
	})
}
