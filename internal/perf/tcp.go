package perf

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// The plain-TCP floor: the same message pattern as the RDMA tests over a
// bare TCP connection with TCP_NODELAY, one Write per message on the
// client, io.ReadFull of one message at a time on the server.
//
// tcp_bw: the client writes messages and then half-closes; the server
// reads until the end and answers one byte, which stops the client's clock
// (as the flush Read does for write_bw). tcp_lat: the server echoes every
// message; one way is half the round trip.

// serveTCP accepts plain-TCP tests until ln is closed.
func (s *Server) serveTCP(ctx context.Context, ln net.Listener, wg *sync.WaitGroup) {
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, net.ErrClosed) {
				s.log().Warn("perf: TCP accept", "err", err)
				time.Sleep(50 * time.Millisecond)
				continue
			}
			return
		}
		wg.Go(func() {
			stop := context.AfterFunc(ctx, func() { c.Close() })
			defer stop()
			defer c.Close()
			if err := s.tcpSession(c); err != nil && ctx.Err() == nil {
				s.log().Warn("perf: TCP session failed", "peer", c.RemoteAddr(), "err", err)
			}
		})
	}
}

func (s *Server) tcpSession(c net.Conn) error {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	var h [tcpHeaderLen]byte
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(c, h[:]); err != nil {
		return fmt.Errorf("reading the test header: %w", err)
	}
	c.SetReadDeadline(time.Time{})
	t, size, err := parseTCPHeader(h[:])
	if err != nil {
		return err
	}
	if size < 1 || size > MaxSize {
		return fmt.Errorf("size %d out of range [1, %d]", size, MaxSize)
	}
	if _, err := c.Write([]byte(tcpMagic)); err != nil {
		return err
	}
	buf := make([]byte, size)
	for {
		if _, err := io.ReadFull(c, buf); err != nil {
			if errors.Is(err, io.EOF) { // the client is done, at a message boundary
				if t == TCPBW {
					_, err := c.Write([]byte{1})
					return err
				}
				return nil
			}
			return err
		}
		if t == TCPLat {
			if _, err := c.Write(buf); err != nil {
				return err
			}
		}
	}
}

func runTCP(ctx context.Context, addr string, t Test, o *Options) (Result, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return Result{}, fmt.Errorf("%v: %w", t, err)
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	tc := c.(*net.TCPConn)
	tc.SetNoDelay(true)
	if _, err := c.Write(appendTCPHeader(nil, t, uint32(o.Size))); err != nil {
		return Result{}, fmt.Errorf("%v: %w", t, err)
	}
	var ok [len(tcpMagic)]byte
	if _, err := io.ReadFull(c, ok[:]); err != nil || string(ok[:]) != tcpMagic {
		return Result{}, fmt.Errorf("%v: server refused the test (%v)", t, err)
	}
	buf := make([]byte, o.Size)
	pattern(buf, clientSeed)
	var res Result
	if t == TCPBW {
		res, err = tcpBW(tc, buf, o)
	} else {
		res, err = tcpLat(tc, buf, o)
	}
	if err != nil && ctx.Err() != nil {
		err = ctx.Err()
	}
	if err != nil {
		return Result{}, fmt.Errorf("%v %d: %w", t, o.Size, err)
	}
	return res, nil
}

func tcpBW(c *net.TCPConn, buf []byte, o *Options) (Result, error) {
	start := time.Now()
	n := 0
	for !o.done(n, start, time.Now()) {
		if _, err := c.Write(buf); err != nil {
			return Result{}, err
		}
		n++
	}
	if err := c.CloseWrite(); err != nil {
		return Result{}, err
	}
	var ack [1]byte
	if _, err := io.ReadFull(c, ack[:]); err != nil {
		return Result{}, fmt.Errorf("waiting for the server's count: %w", err)
	}
	return bandwidthResult(TCPBW, len(buf), n, time.Since(start)), nil
}

func tcpLat(c *net.TCPConn, buf []byte, o *Options) (Result, error) {
	samples := newSamples(o)
	start := time.Now()
	t0 := start
	for i := 0; !o.done(i, start, t0); i++ {
		if _, err := c.Write(buf); err != nil {
			return Result{}, err
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			return Result{}, err
		}
		t1 := time.Now()
		samples = append(samples, int64(t1.Sub(t0)))
		t0 = t1
	}
	c.CloseWrite()
	return latencyResult(TCPLat, len(buf), samples, time.Since(start), true), nil
}
