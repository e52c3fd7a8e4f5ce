package cm

import (
	"bytes"
	"context"
	"net"
	"testing"
	"time"

	"github.com/gowarp/gowarp/wire"
)

// TestExtNegotiation: RFC 7306's extensions are on only when both sides
// offer them; the offer block never reaches a side that did not offer,
// and neither application sees a block in the private data.
func TestExtNegotiation(t *testing.T) {
	for _, tt := range []struct {
		name     string
		ini, rsp bool
		rev      int
	}{
		{"both", true, true, 2}, {"both rev 1", true, true, 1},
		{"initiator only", true, false, 2}, {"responder only", false, true, 2}, {"neither", false, false, 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			a, b := net.Pipe()
			defer a.Close()
			defer b.Close()
			done := acceptAsync(ctx, b, Options{Ext: tt.rsp, PrivateData: []byte("reply")})
			res, err := Initiate(ctx, a, Options{Revision: tt.rev, Ext: tt.ini, PrivateData: []byte("request")})
			if err != nil {
				t.Fatal(err)
			}
			o := <-done
			if o.err != nil {
				t.Fatal(o.err)
			}
			want := tt.ini && tt.rsp
			if res.Ext != want || o.res.Ext != want || o.req.OffersExt() != tt.ini {
				t.Errorf("initiator Ext %v, responder Ext %v, offered %v; want %v", res.Ext, o.res.Ext, o.req.OffersExt(), want)
			}
			if string(res.PrivateData) != "reply" || string(o.req.PrivateData()) != "request" || string(o.res.PrivateData) != "request" {
				t.Errorf("private data %q / %q / %q", res.PrivateData, o.req.PrivateData(), o.res.PrivateData)
			}
		})
	}
}

// TestNoExtBlockUnasked: the bytes an initiator and a responder put on
// the wire carry no offer block unless they offer (the responder: unless
// the request carried one), whatever the other asked.
func TestNoExtBlockUnasked(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// An initiator that does not offer: its request, read raw.
	a, b := net.Pipe()
	go Initiate(ctx, a, Options{PrivateData: []byte("x")})
	f, err := readFrame(b)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(f.PrivateData, extMagic[:]) {
		t.Fatalf("request carries an offer: % x", f.PrivateData)
	}
	a.Close()
	b.Close()

	// A responder that offers, to a raw request without an offer.
	a, b = net.Pipe()
	defer a.Close()
	defer b.Close()
	go func() {
		if req, err := readRequest(ctx, b); err == nil {
			req.Accept(ctx, Options{Ext: true, PrivateData: []byte("y")})
		}
	}()
	req := wire.MPAFrame{Revision: 2, Enhanced: true, IRD: 1, ORD: 1, PrivateData: []byte("z")}
	if err := writeFrame(a, &req); err != nil {
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

func TestExtPrivateDataLimit(t *testing.T) {
	o := Options{Ext: true, PrivateData: make([]byte, wire.MaxMPAPrivateData-4-extBlockLen+1)}
	o.defaults()
	if err := o.check(); err == nil {
		t.Fatal("private data that leaves no room for the offer block accepted")
	}
	o.PrivateData = o.PrivateData[1:]
	if err := o.check(); err != nil {
		t.Fatal(err)
	}
}
