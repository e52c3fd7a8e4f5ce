package rping

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
)

func TestInfoRoundTrip(t *testing.T) {
	// The advertisement siw's rping client sent in the capture
	// wire/testdata/siw/rping-64x3.pcap (siwvm README).
	wire := []byte{0x00, 0x00, 0x55, 0xa6, 0xb5, 0x85, 0x4b, 0x80, 0xd3, 0xa9, 0xd3, 0x00, 0x00, 0x00, 0x00, 0x40}
	i, err := ParseInfo(wire)
	if err != nil {
		t.Fatal(err)
	}
	if want := (Info{Buf: 0x000055a6b5854b80, RKey: 0xd3a9d300, Size: 64}); i != want {
		t.Fatalf("ParseInfo = %+v, want %+v", i, want)
	}
	if got := i.Append(nil); !bytes.Equal(got, wire) {
		t.Fatalf("Append = % x, want % x", got, wire)
	}
	for _, n := range []int{0, 15, 17, 32} {
		if _, err := ParseInfo(make([]byte, n)); !errors.Is(err, ErrBadMessage) {
			t.Errorf("ParseInfo of %d bytes: %v, want ErrBadMessage", n, err)
		}
	}
}

func TestFillPing(t *testing.T) {
	tests := []struct {
		ping int
		size int
		want string
	}{
		// rping-64x3.pcap's first Read Response: prefix, 'A' onwards, NUL last.
		{0, 64, "rdma-ping-0: ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqr\x00"},
		{1, 26, "rdma-ping-1: BCDEFGHIJKLM\x00"},
		// The start character wraps after 'z' (58 characters).
		{57, 26, "rdma-ping-57: zABCDEFGHIJ\x00"},
		{58, 26, "rdma-ping-58: ABCDEFGHIJK\x00"},
	}
	for _, tt := range tests {
		buf := make([]byte, tt.size)
		FillPing(buf, tt.ping)
		if string(buf) != tt.want {
			t.Errorf("FillPing(%d, %d) = %q, want %q", tt.ping, tt.size, buf, tt.want)
		}
	}
	// Within a buffer the run wraps from 'z' to 'A' too.
	buf := make([]byte, 200)
	FillPing(buf, 0)
	if !strings.Contains(string(buf), "xyzABC") {
		t.Errorf("no wrap from 'z' to 'A' in %q", buf)
	}
}

func TestCheckSize(t *testing.T) {
	for _, s := range []int{MinSize, 64, 5000, MaxSize} {
		if err := CheckSize(s); err != nil {
			t.Errorf("CheckSize(%d) = %v", s, err)
		}
	}
	for _, s := range []int{0, MinSize - 1, MaxSize + 1} {
		if CheckSize(s) == nil {
			t.Errorf("CheckSize(%d) accepted", s)
		}
	}
}

// TestPingPong runs the gowarp client against the gowarp server over
// loopback in the settings siw has: MPA revision 1 and 2, CRC asked for by
// either side or neither, peer-to-peer mode or not, sizes up to 64 KiB.
func TestPingPong(t *testing.T) {
	tests := []struct {
		name       string
		size       int
		count      int
		client     gowarp.ConnectOptions
		server     gowarp.ConnectOptions
		persistent bool
	}{
		{name: "rping defaults", size: 64, count: 3, client: gowarp.ConnectOptions{IRD: 1, ORD: 1, NoP2P: true}},
		{name: "min size", size: MinSize, count: 2, client: gowarp.ConnectOptions{IRD: 1, ORD: 1, NoP2P: true}},
		{name: "5000 bytes", size: 5000, count: 4, client: gowarp.ConnectOptions{IRD: 1, ORD: 1, NoP2P: true}},
		{name: "64 KiB", size: MaxSize, count: 3, client: gowarp.ConnectOptions{IRD: 1, ORD: 1, NoP2P: true}},
		{name: "client CRC", size: 1000, count: 2, client: gowarp.ConnectOptions{CRC: true, NoP2P: true}},
		{name: "server CRC", size: 1000, count: 2, client: gowarp.ConnectOptions{NoP2P: true}, server: gowarp.ConnectOptions{CRC: true}},
		{name: "revision 1", size: 4096, count: 2, client: gowarp.ConnectOptions{MPARevision: 1}},
		{name: "revision 1 CRC", size: 4096, count: 2, client: gowarp.ConnectOptions{MPARevision: 1, CRC: true}},
		{name: "peer-to-peer", size: 300, count: 2, client: gowarp.ConnectOptions{IRD: 1, ORD: 1}},
		{name: "small FPDUs", size: 20000, count: 2, client: gowarp.ConnectOptions{NoP2P: true, MaxFPDU: 1448}, server: gowarp.ConnectOptions{MaxFPDU: 1448}},
		{name: "private data", size: 64, count: 1, client: gowarp.ConnectOptions{NoP2P: true, PrivateData: bytes.Repeat([]byte{7}, 252)}},
		{name: "persistent", size: 64, count: 2, client: gowarp.ConnectOptions{NoP2P: true}, persistent: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, dev, ln := setup(t)
			var sv bytes.Buffer
			errc := make(chan error, 1)
			sctx, scancel := context.WithCancel(ctx)
			defer scancel()
			go func() {
				errc <- Serve(sctx, dev, ln, tt.persistent, ServerOptions{Verbose: &sv, Connect: tt.server})
			}()
			clients := 1
			if tt.persistent {
				clients = 2
			}
			for k := range clients {
				var cl bytes.Buffer
				r, err := Ping(ctx, gowarp.Open(), ln.Addr().String(), ClientOptions{
					Size: tt.size, Count: tt.count, Validate: true, Verbose: &cl, Connect: tt.client})
				if err != nil {
					t.Fatalf("client %d: %v", k, err)
				}
				if r.Pings != tt.count {
					t.Errorf("client %d: %d pings, want %d", k, r.Pings, tt.count)
				}
				for i, line := range strings.Split(strings.TrimSuffix(cl.String(), "\n"), "\n") {
					want := make([]byte, tt.size)
					FillPing(want, i)
					if line != "ping data: "+string(CString(want)) {
						t.Errorf("client line %d = %.60q...", i, line)
					}
				}
			}
			if tt.persistent {
				time.Sleep(50 * time.Millisecond)
				scancel()
			}
			if err := <-errc; err != nil {
				t.Fatalf("server: %v", err)
			}
			if got := strings.Count(sv.String(), "server ping data: rdma-ping-"); got != clients*tt.count {
				t.Errorf("server printed %d pings, want %d:\n%.300s", got, clients*tt.count, sv.String())
			}
		})
	}
}

// TestServerCount ends a session after the server's own count.
func TestServerCount(t *testing.T) {
	ctx, dev, ln := setup(t)
	errc := make(chan error, 1)
	go func() { errc <- Serve(ctx, dev, ln, false, ServerOptions{Count: 2}) }()
	r, err := Ping(ctx, gowarp.Open(), ln.Addr().String(), ClientOptions{Count: 5, Validate: true, Connect: gowarp.ConnectOptions{NoP2P: true}})
	if err == nil || r.Pings != 2 {
		t.Errorf("client against a 2-ping server: %d pings, err %v; want 2 and an error", r.Pings, err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("server: %v", err)
	}
}

// TestBadAdvertisement: a client advertising a start buffer it never
// registered makes the server's Read fail with a remote access error.
func TestBadAdvertisement(t *testing.T) {
	ctx, dev, ln := setup(t)
	errc := make(chan error, 1)
	go func() { errc <- Serve(ctx, dev, ln, false, ServerOptions{}) }()

	// A client that advertises a start buffer with a wrong STag: the
	// server's Read meets the client's Terminate.
	c, err := newConn(gowarp.Open())
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	if err := c.postRecv(); err != nil {
		t.Fatal(err)
	}
	if err := c.qp.Connect(ctx, ln.Addr().String(), gowarp.ConnectOptions{NoP2P: true}); err != nil {
		t.Fatal(err)
	}
	if err := c.sendInfo(Info{Buf: 0x1000, RKey: 0xdead00, Size: 64}); err != nil {
		t.Fatal(err)
	}
	err = <-errc
	if !errors.Is(err, gowarp.RemoteAccessError) && !errors.Is(err, gowarp.ErrPeerTerminated) {
		t.Fatalf("server error %v, want a remote access error", err)
	}
}

// TestNudge: a server that answers the first message late gets the
// queue pair's zero-length Writes meanwhile (gowarp.ConnectOptions.NoNudge),
// which change nothing, and the session goes on.
func TestNudge(t *testing.T) {
	ctx, dev, ln := setup(t)
	errc := make(chan error, 1)
	go func() {
		errc <- func() error {
			req, err := ln.Accept(ctx)
			if err != nil {
				return err
			}
			c, err := newConn(dev)
			if err != nil {
				return err
			}
			defer c.close()
			buf, err := c.pd.Register(make([]byte, MaxSize+1), gowarp.LocalWrite|gowarp.RemoteRead|gowarp.RemoteWrite)
			if err != nil {
				return err
			}
			if err := c.postRecv(); err != nil {
				return err
			}
			if err := req.Accept(ctx, c.qp, gowarp.ConnectOptions{}); err != nil {
				return err
			}
			// Silent for the whole nudge window (20 × 50 ms): about 20
			// nudges are due, so 2 hold however slowly the ticker runs on
			// a busy machine (300 ms gave 1 nudge now and then).
			time.Sleep(time.Second)
			_, err = serve(ctx, c, buf, ServerOptions{Count: 2})
			return err
		}()
	}()
	r, err := Ping(ctx, gowarp.Open(), ln.Addr().String(), ClientOptions{Count: 2, Validate: true,
		Connect: gowarp.ConnectOptions{NoP2P: true, NudgeEvery: 50 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	if r.Pings != 2 || r.Nudges < 2 {
		t.Errorf("%d pings with %d nudges; want 2 pings and at least 2 nudges", r.Pings, r.Nudges)
	}
	if err := <-errc; err != nil {
		t.Fatalf("server: %v", err)
	}
}

// setup gives a test a 20-second context and a listening device on
// loopback, both ended with the test.
func setup(t *testing.T) (context.Context, *gowarp.Device, *gowarp.Listener) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	dev := gowarp.Open()
	ln, err := dev.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ctx, dev, ln
}

// TestPersistentServerFreesRegions: a persistent server deregisters each
// client's regions when the client leaves, and a client its own when it
// is done: the STag tables of both devices are as empty after 20 clients
// as before.
func TestPersistentServerFreesRegions(t *testing.T) {
	ctx, dev, ln := setup(t)
	sctx, scancel := context.WithCancel(ctx)
	defer scancel()
	errc := make(chan error, 1)
	go func() { errc <- Serve(sctx, dev, ln, true, ServerOptions{}) }()
	cdev := gowarp.Open()
	before := dev.DefaultTable().Len()
	for k := range 20 {
		if _, err := Ping(ctx, cdev, ln.Addr().String(), ClientOptions{Count: 2, Validate: true, Connect: gowarp.ConnectOptions{NoP2P: true}}); err != nil {
			t.Fatalf("client %d: %v", k, err)
		}
	}
	if n := cdev.DefaultTable().Len(); n != 0 {
		t.Errorf("%d regions left registered by 20 clients", n)
	}
	// The server's session ends a moment after its client's.
	for deadline := time.Now().Add(5 * time.Second); dev.DefaultTable().Len() != before; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d regions left registered by the server after 20 clients, %d before", dev.DefaultTable().Len(), before)
		}
	}
	scancel()
	if err := <-errc; err != nil {
		t.Fatalf("server: %v", err)
	}
}
