package cm

import (
	"bytes"
	"context"
	"net"
	"testing"
	"time"

	"github.com/gowarp/gowarp/wire"
)

// FuzzExchange feeds both sides of the MPA exchange whatever a peer may
// send: the responder reads a request from the bytes and answers it, the
// initiator sends its request and reads the bytes as the reply. Neither
// may panic or hang, and a Result is only ever one the options allow.
func FuzzExchange(f *testing.F) {
	for _, fr := range []wire.MPAFrame{
		{Revision: 2, Enhanced: true, P2P: true, RTR: wire.RTRWrite, IRD: 16, ORD: 16},
		{Revision: 2, Enhanced: true, CRC: true, IRD: 4, ORD: 4, PrivateData: appendExt([]byte("hello"))},
		{Revision: 1, PrivateData: []byte("rping")},
		{Reply: true, Revision: 2, Enhanced: true, P2P: true, RTR: wire.RTRWrite, IRD: 16, ORD: 16, PrivateData: appendExt(nil)},
		{Reply: true, Revision: 2, Enhanced: true, IRD: 200, ORD: 200},
		{Reply: true, Reject: true, Revision: 2, PrivateData: []byte("no")},
		{Reply: true, Revision: 1, Markers: true},
	} {
		b, err := fr.Append(nil)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, true)
		f.Add(b, false)
		f.Add(b[:len(b)/2], true)
	}
	f.Fuzz(func(t *testing.T, in []byte, ext bool) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		o := Options{Revision: 2, IRD: 8, ORD: 8, Ext: ext, PrivateData: []byte("pd")}

		// Responder: the bytes are the initiator's.
		if req, err := readRequest(ctx, &bytesConn{r: bytes.NewReader(in)}); err == nil {
			if res, err := req.Accept(ctx, o); err == nil {
				if res.IRD > MaxIRDORD || res.ORD > o.ORD || res.Ext && !ext {
					t.Fatalf("responder settled %+v for options %+v", res, o)
				}
			}
		}
		// Initiator: the bytes are the responder's reply.
		if res, err := Initiate(ctx, &bytesConn{r: bytes.NewReader(in)}, o); err == nil {
			if res.IRD > MaxIRDORD || res.ORD > o.ORD || res.Ext && !ext {
				t.Fatalf("initiator settled %+v for options %+v", res, o)
			}
		}
	})
}

// bytesConn is a connection whose peer sent r's bytes and then closed;
// what is written to it is dropped.
type bytesConn struct{ r *bytes.Reader }

func (c *bytesConn) Read(b []byte) (int, error)       { return c.r.Read(b) }
func (c *bytesConn) Write(b []byte) (int, error)      { return len(b), nil }
func (c *bytesConn) Close() error                     { return nil }
func (c *bytesConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *bytesConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *bytesConn) SetDeadline(time.Time) error      { return nil }
func (c *bytesConn) SetReadDeadline(time.Time) error  { return nil }
func (c *bytesConn) SetWriteDeadline(time.Time) error { return nil }
