package gowarp_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"math/big"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
)

// testTLS returns a server and a client configuration around a
// self-signed certificate for 127.0.0.1, made for this run.
func testTLS(t testing.TB) (server, client *tls.Config) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "gowarp test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	server = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}
	client = &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}
	return server, client
}

// tapConn records the bytes a connection sends.
type tapConn struct {
	net.Conn
	mu   sync.Mutex
	sent bytes.Buffer
}

// Write records b before it writes it: the peer's answer to it can
// complete work, and the test read the record, before a Write that
// recorded after returned (TestImmWire missed its Atomic Request so, once
// under -race).
func (c *tapConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	c.sent.Write(b)
	c.mu.Unlock()
	n, err := c.Conn.Write(b)
	if n < len(b) {
		c.mu.Lock()
		c.sent.Truncate(c.sent.Len() - (len(b) - n))
		c.mu.Unlock()
	}
	return n, err
}

func (c *tapConn) bytes() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return bytes.Clone(c.sent.Bytes())
}

// newPairOver connects two queue pairs with the constructors over a
// caller's stream: the responder's Listener made by ListenOn(ln), the
// initiator's ConnectConn over what dial returns.
func newPairOver(t *testing.T, ln net.Listener, dial func() (net.Conn, error), o gowarp.ConnectOptions) *pair {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p := newIdlePair(t, 1024)
	var err error
	t.Cleanup(func() { p.a.Close(); p.b.Close() })
	gl, err := p.dev.ListenOn(ln)
	if err != nil {
		t.Fatal(err)
	}
	defer gl.Close()
	errc := make(chan error, 1)
	go func() {
		req, err := gl.Accept(ctx)
		if err != nil {
			errc <- err
			return
		}
		errc <- req.Accept(ctx, p.b, o)
	}()
	c, err := dial()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.a.ConnectConn(ctx, c, o); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	return p
}

// exercise runs a Write, a Read of it back and a Send from a to b, each of
// n bytes of pattern, and checks every byte and completion.
func exercise(t *testing.T, p *pair, pattern []byte, n int) {
	t.Helper()
	src, sbuf := p.reg(t, n, gowarp.LocalWrite)
	for i := range sbuf {
		sbuf[i] = pattern[i%len(pattern)]
	}
	dst, dbuf := p.reg(t, n, gowarp.RemoteWrite|gowarp.RemoteRead|gowarp.LocalWrite)
	if err := p.a.PostSend(&gowarp.SendWR{ID: 1, Op: gowarp.OpWrite, Flags: gowarp.Signaled,
		SGL: []gowarp.SGE{{MR: src, Length: n}}, RemoteAddr: dst.Addr(), RKey: dst.STag()}); err != nil {
		t.Fatal(err)
	}
	if c := wait(t, p.acq); c.Status != gowarp.Success || c.ID != 1 {
		t.Fatalf("write completion %+v", c)
	}
	back, bbuf := p.reg(t, n, gowarp.LocalWrite)
	if err := p.a.PostSend(&gowarp.SendWR{ID: 2, Op: gowarp.OpRead, Flags: gowarp.Signaled,
		SGL: []gowarp.SGE{{MR: back, Length: n}}, RemoteAddr: dst.Addr(), RKey: dst.STag()}); err != nil {
		t.Fatal(err)
	}
	if c := wait(t, p.acq); c.Status != gowarp.Success || c.ID != 2 || c.Bytes != n {
		t.Fatalf("read completion %+v", c)
	}
	if dst.Placed() != uint64(n) || !bytes.Equal(dbuf, sbuf) || !bytes.Equal(bbuf, sbuf) {
		t.Fatal("written or read data differs")
	}
	rmr, rbuf := p.reg(t, n, gowarp.LocalWrite)
	if err := p.b.PostRecv(&gowarp.RecvWR{ID: 9, SGL: []gowarp.SGE{{MR: rmr, Length: n}}}); err != nil {
		t.Fatal(err)
	}
	if err := p.a.PostSend(&gowarp.SendWR{ID: 3, Op: gowarp.OpSend, Flags: gowarp.Signaled,
		SGL: []gowarp.SGE{{MR: src, Length: n}}}); err != nil {
		t.Fatal(err)
	}
	if c := wait(t, p.bcq); c.Status != gowarp.Success || c.ID != 9 || c.Bytes != n {
		t.Fatalf("recv completion %+v", c)
	}
	if c := wait(t, p.acq); c.Status != gowarp.Success || c.ID != 3 {
		t.Fatalf("send completion %+v", c)
	}
	if !bytes.Equal(rbuf, sbuf) {
		t.Fatal("sent data differs")
	}
}

// TestOverTLS: a queue pair connected with ConnectConn over a crypto/tls
// connection to a Listener made by ListenOn over a tls.Listener carries
// Writes, Reads and Sends, both ways of CRC, and what goes over TCP is
// TLS: the payload's pattern never appears on the wire in clear. When the
// TCP connection under TLS dies, the peer's queue pair fails.
func TestOverTLS(t *testing.T) {
	srvConf, cliConf := testTLS(t)
	pattern := []byte("gowarp-in-the-clear-would-show-this!")
	for _, crc := range []bool{false, true} {
		tcp, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		var tap *tapConn
		p := newPairOver(t, tls.NewListener(tcp, srvConf), func() (net.Conn, error) {
			c, err := net.Dial("tcp", tcp.Addr().String())
			if err != nil {
				return nil, err
			}
			tap = &tapConn{Conn: c}
			return tls.Client(tap, cliConf), nil
		}, gowarp.ConnectOptions{CRC: crc})
		if !p.a.Params().CRC == crc {
			t.Fatalf("CRC %v, asked %v", p.a.Params().CRC, crc)
		}
		exercise(t, p, pattern, 200000)
		wire := tap.bytes()
		if len(wire) < 400000 { // the Write's and the Send's bytes at least
			t.Fatalf("%d bytes on the wire", len(wire))
		}
		if bytes.Contains(wire, pattern[:16]) {
			t.Fatal("payload in clear on the wire")
		}
		// The TCP connection under the client's TLS dies: the server's
		// queue pair fails and flushes its receive, it does not hang.
		rmr, _ := p.reg(t, 64, gowarp.LocalWrite)
		if err := p.b.PostRecv(&gowarp.RecvWR{ID: 77, SGL: []gowarp.SGE{{MR: rmr, Length: 64}}}); err != nil {
			t.Fatal(err)
		}
		tap.Conn.Close()
		if c := wait(t, p.bcq); c.ID != 77 || c.Status != gowarp.WRFlushError {
			t.Fatalf("server's receive after the client's TCP closed: %+v", c)
		}
		if err := p.b.Err(); !errors.Is(err, gowarp.ErrPeerClosed) && !errors.Is(err, gowarp.ErrLinkLost) {
			t.Fatalf("server queue pair's error: %v", err)
		}
	}
}

// TestConnectConnAndListenOnTCP: the same constructors over a caller's
// own TCP listener and connection, with the send first from the
// responder side as well (peer-to-peer mode).
func TestConnectConnAndListenOnTCP(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := newPairOver(t, ln, func() (net.Conn, error) { return net.Dial("tcp", ln.Addr().String()) }, gowarp.ConnectOptions{})
	exercise(t, p, []byte{1, 2, 3, 5, 8, 13}, 100000)
	p.a, p.b, p.acq, p.bcq = p.b, p.a, p.bcq, p.acq
	exercise(t, p, []byte{21, 34}, 1000)
}

// TestConnectConnBadStream: ConnectConn over a connection that is closed,
// whose peer hangs up, answers with something that is not MPA, or says
// nothing, fails with an error that says so and leaves the queue pair in
// error, without hanging; the queue pair closes the connection.
func TestConnectConnBadStream(t *testing.T) {
	dev := gowarp.Open()
	pd := dev.AllocPD()
	cq := dev.NewCQ(16)
	// serve runs peer on the far end of a TCP connection and returns the
	// near end.
	serve := func(t *testing.T, peer func(c net.Conn)) net.Conn {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			peer(c)
		}()
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	// readRequest reads the whole MPA request, so that a close sends a
	// FIN rather than a reset.
	readRequest := func(c net.Conn) {
		hdr := make([]byte, 20)
		io.ReadFull(c, hdr)
		io.ReadFull(c, make([]byte, int(hdr[18])<<8|int(hdr[19])))
	}
	for _, tc := range []struct {
		name    string
		conn    func(t *testing.T) net.Conn
		timeout time.Duration
		want    error
	}{
		{"closed", func(t *testing.T) net.Conn {
			c := serve(t, func(c net.Conn) { io.Copy(io.Discard, c) })
			c.Close()
			return c
		}, 0, net.ErrClosed},
		{"peer hangs up", func(t *testing.T) net.Conn {
			return serve(t, func(c net.Conn) { readRequest(c) })
		}, 0, io.ErrUnexpectedEOF},
		{"peer speaks HTTP", func(t *testing.T) net.Conn {
			return serve(t, func(c net.Conn) {
				readRequest(c)
				io.WriteString(c, "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
				io.Copy(io.Discard, c)
			})
		}, 0, gowarp.ErrMPAProtocol},
		{"peer silent", func(t *testing.T) net.Conn {
			return serve(t, func(c net.Conn) { io.Copy(io.Discard, c) })
		}, 200 * time.Millisecond, context.DeadlineExceeded},
		{"TLS peer speaks plain MPA", func(t *testing.T) net.Conn {
			_, cliConf := testTLS(t)
			return tls.Client(serve(t, func(c net.Conn) {
				io.WriteString(c, "MPA ID Rep Frame")
				io.Copy(io.Discard, c)
			}), cliConf)
		}, 0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			qp, err := pd.NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq})
			if err != nil {
				t.Fatal(err)
			}
			defer qp.Close()
			c := tc.conn(t)
			ctx := boundedCtx(t)
			if tc.timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.timeout)
				defer cancel()
			}
			err = qp.ConnectConn(ctx, c, gowarp.ConnectOptions{})
			if err == nil || tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("ConnectConn: %v, want %v", err, tc.want)
			}
			t.Log(err)
			if s := qp.State(); s != gowarp.StateError {
				t.Fatalf("state %v after a failed ConnectConn", s)
			}
			// The queue pair closed the connection.
			if _, err := c.Write([]byte{0}); !errors.Is(err, net.ErrClosed) {
				t.Fatalf("write on the connection after the failure: %v", err)
			}
		})
	}
}

// TestConnectConnNotIdle: ConnectConn on a queue pair that is not idle
// fails with ErrBadState and closes the connection it was given (the
// queue pair owns it from the call on).
func TestConnectConnNotIdle(t *testing.T) {
	p := newPair(t, gowarp.ConnectOptions{})
	c1, c2 := net.Pipe()
	defer c2.Close()
	err := p.a.ConnectConn(boundedCtx(t), c1, gowarp.ConnectOptions{})
	if !errors.Is(err, gowarp.ErrBadState) {
		t.Fatalf("ConnectConn on a connected QP: %v", err)
	}
	if _, err := c1.Write([]byte{0}); !errors.Is(err, io.ErrClosedPipe) {
		t.Fatalf("connection left open: %v", err)
	}
}

// TestCloseDuringConnectConn: a Close while ConnectConn waits for a
// silent peer's reply ends it with ErrClosed.
func TestCloseDuringConnectConn(t *testing.T) {
	dev := gowarp.Open()
	cq := dev.NewCQ(4)
	qp, err := dev.AllocPD().NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq})
	if err != nil {
		t.Fatal(err)
	}
	c1, c2 := net.Pipe()
	go io.Copy(io.Discard, c2) // takes the request, answers nothing
	defer c2.Close()
	errc := make(chan error, 1)
	go func() { errc <- qp.ConnectConn(boundedCtx(t), c1, gowarp.ConnectOptions{}) }()
	for qp.State() != gowarp.StateConnecting {
		time.Sleep(time.Millisecond)
	}
	qp.Close()
	if err := <-errc; !errors.Is(err, gowarp.ErrClosed) {
		t.Fatalf("ConnectConn after Close: %v", err)
	}
}

// TestListenOnDropsBadClients: a Listener made by ListenOn over a TLS
// listener drops a client that speaks plain TCP, and one that completes
// TLS but sends no MPA request, and still accepts a good client after
// them.
func TestListenOnDropsBadClients(t *testing.T) {
	srvConf, cliConf := testTLS(t)
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dev := gowarp.Open()
	ln, err := dev.ListenOn(tls.NewListener(tcp, srvConf))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	addr := tcp.Addr().String()
	plain, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	io.WriteString(plain, "MPA ID Req Frame\x80\x00\x00\x00") // not a TLS hello
	garbled, err := tls.Dial("tcp", addr, cliConf)
	if err != nil {
		t.Fatal(err)
	}
	defer garbled.Close()
	io.WriteString(garbled, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")

	cq := dev.NewCQ(16)
	pd := dev.AllocPD()
	a, _ := pd.NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq})
	b, _ := pd.NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq})
	defer a.Close()
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		c, err := tls.Dial("tcp", addr, cliConf)
		if err != nil {
			errc <- err
			return
		}
		errc <- a.ConnectConn(ctx, c, gowarp.ConnectOptions{PrivateData: []byte("good")})
	}()
	req, err := ln.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if string(req.PrivateData()) != "good" {
		t.Fatalf("accepted a request with private data %q", req.PrivateData())
	}
	if err := req.Accept(ctx, b, gowarp.ConnectOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	// The bad clients were hung up on.
	for _, c := range []net.Conn{plain, garbled} {
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.Copy(io.Discard, c); err != nil && !errors.Is(err, net.ErrClosed) && !isReset(err) {
			t.Fatalf("bad client's connection: %v", err)
		}
	}
}

func isReset(err error) bool {
	var ne *net.OpError
	return errors.As(err, &ne) && !ne.Timeout()
}

// TestReadConnRequestOverPipe: the passive side over one connection the
// caller has, here an in-memory net.Pipe (no socket at all): ConnectConn
// on one end, ReadConnRequest and Accept on the other, then Writes, Reads
// and Sends both ways.
func TestReadConnRequestOverPipe(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p := newIdlePair(t, 64)
	t.Cleanup(func() { p.a.Close(); p.b.Close() })
	ca, cb := net.Pipe()
	errc := make(chan error, 1)
	go func() {
		req, err := gowarp.ReadConnRequest(ctx, cb)
		if err != nil {
			errc <- err
			return
		}
		if string(req.PrivateData()) != "over a pipe" {
			errc <- errors.New("private data " + string(req.PrivateData()))
			return
		}
		errc <- req.Accept(ctx, p.b, gowarp.ConnectOptions{CRC: true})
	}()
	if err := p.a.ConnectConn(ctx, ca, gowarp.ConnectOptions{PrivateData: []byte("over a pipe")}); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if !p.a.Params().CRC {
		t.Fatal("CRC asked by the responder not settled")
	}
	exercise(t, p, []byte("piped"), 100000)
	p.a, p.b, p.acq, p.bcq = p.b, p.a, p.bcq, p.acq
	exercise(t, p, []byte("back"), 5000)
}

// TestReadConnRequestBadPeer: ReadConnRequest on a connection whose peer
// speaks something else, hangs up or says nothing fails saying so, closes
// the connection, and does not hang.
func TestReadConnRequestBadPeer(t *testing.T) {
	for _, tc := range []struct {
		name string
		peer func(c net.Conn)
		want error
	}{
		{"HTTP", func(c net.Conn) { io.WriteString(c, "GET / HTTP/1.1\r\nHost: gowarp\r\n\r\n") }, gowarp.ErrMPAProtocol},
		{"a reply", func(c net.Conn) { io.WriteString(c, "MPA ID Rep Frame\x00\x02\x00\x00") }, gowarp.ErrMPAProtocol},
		{"hangs up", func(c net.Conn) { io.WriteString(c, "MPA ID"); c.Close() }, io.ErrUnexpectedEOF},
		{"silent", func(c net.Conn) {}, context.DeadlineExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ca, cb := net.Pipe()
			defer ca.Close()
			go tc.peer(ca)
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			_, err := gowarp.ReadConnRequest(ctx, cb)
			if !errors.Is(err, tc.want) {
				t.Fatalf("ReadConnRequest: %v, want %v", err, tc.want)
			}
			if _, err := cb.Write([]byte{0}); !errors.Is(err, io.ErrClosedPipe) {
				t.Fatalf("connection left open: %v", err)
			}
		})
	}
}

// TestRejectedErrorZeroValue: a RejectedError made by the caller (as a
// test double, say) still prints and matches ErrRejected.
func TestRejectedErrorZeroValue(t *testing.T) {
	e := &gowarp.RejectedError{PrivateData: []byte("no")}
	if !errors.Is(e, gowarp.ErrRejected) || e.Error() == "" {
		t.Fatalf("%q does not match ErrRejected", e.Error())
	}
}

// TestOverTLSReadsBothWays: over TLS (a stream whose writes block), both
// queue pairs Read from each other at once, with many 64 KiB Read
// Responses in flight each way, so that each receive path has responses
// to answer while the other's are coming: all complete, neither side's
// receive path waits on a write the other cannot take.
func TestOverTLSReadsBothWays(t *testing.T) {
	srvConf, cliConf := testTLS(t)
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o := gowarp.ConnectOptions{IRD: 128, ORD: 128}
	p := newPairOver(t, tls.NewListener(tcp, srvConf), func() (net.Conn, error) {
		return tls.Dial("tcp", tcp.Addr().String(), cliConf)
	}, o)
	const size, depth, rounds = 64 << 10, 100, 10
	type side struct {
		qp       *gowarp.QP
		cq       *gowarp.CQ
		src, dst *gowarp.MR
	}
	mk := func(qp *gowarp.QP, cq *gowarp.CQ) *side {
		src, _ := p.reg(t, size, gowarp.RemoteRead)
		dst, _ := p.reg(t, size, gowarp.LocalWrite)
		return &side{qp, cq, src, dst}
	}
	a, b := mk(p.a, p.acq), mk(p.b, p.bcq)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// A stuck exchange blocks in PostSendList, which no ctx ends: closing
	// the queue pairs does.
	defer context.AfterFunc(ctx, func() { p.a.Close(); p.b.Close() })()
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for _, s := range [][2]*side{{a, b}, {b, a}} {
		me, peer := s[0], s[1]
		wg.Go(func() {
			wc := make([]gowarp.Completion, depth)
			for range rounds {
				wrs := make([]gowarp.SendWR, depth)
				for i := range wrs {
					wrs[i] = gowarp.SendWR{ID: uint64(i), Op: gowarp.OpRead, Flags: gowarp.Signaled,
						SGL: []gowarp.SGE{{MR: me.dst, Length: size}}, RemoteAddr: peer.src.Addr(), RKey: peer.src.STag()}
				}
				if _, err := me.qp.PostSendList(wrs); err != nil {
					errs <- err
					return
				}
				for got := 0; got < depth; {
					n := me.cq.Poll(wc)
					for _, c := range wc[:n] {
						if c.Status != gowarp.Success {
							errs <- c.Err()
							return
						}
					}
					got += n
					if n == 0 {
						if err := me.cq.Wait(ctx); err != nil {
							errs <- err
							return
						}
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}
