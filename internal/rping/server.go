package rping

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/gowarp/gowarp"
)

// ServerOptions are rping's server flags.
type ServerOptions struct {
	// Count stops a session after this many pings (0: serve until the
	// client disconnects, as rping's server does).
	Count int
	// Verbose receives rping's -v lines ("server ping data: ..."); nil
	// for none.
	Verbose io.Writer
	// Log receives one line per finished session of a persistent server;
	// nil for none.
	Log io.Writer
	// Connect tunes the reply. A client's revision and CRC wish are
	// honoured; ORD ends up capped at the client's IRD.
	Connect gowarp.ConnectOptions
}

// Serve accepts rping clients on ln. Without persistent it serves one
// client and returns that session's error; with it (rping -P) it serves
// every client in its own goroutine until ctx is done, and a failing
// client never stops it.
func Serve(ctx context.Context, dev *gowarp.Device, ln *gowarp.Listener, persistent bool, o ServerOptions) error {
	if !persistent {
		req, err := ln.Accept(ctx)
		if err != nil {
			return err
		}
		_, err = ServeConn(ctx, dev, req, o)
		return err
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	var logMu sync.Mutex
	if o.Verbose != nil {
		o.Verbose = &lockedWriter{mu: &logMu, w: o.Verbose}
	}
	for {
		req, err := ln.Accept(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			peer := req.RemoteAddr()
			r, err := ServeConn(ctx, dev, req, o)
			if o.Log != nil {
				logMu.Lock()
				if err != nil {
					fmt.Fprintf(o.Log, "rping: %v: %d pings, %v\n", peer, r.Pings, err)
				} else {
					fmt.Fprintf(o.Log, "rping: %v: %d pings\n", peer, r.Pings)
				}
				logMu.Unlock()
			}
		}()
	}
}

// ServeConn accepts one client's request and serves its pings until it
// disconnects (or Count pings are done). A client that leaves between
// pings ends the session without an error.
func ServeConn(ctx context.Context, dev *gowarp.Device, req *gowarp.ConnRequest, o ServerOptions) (Result, error) {
	c, err := newConn(dev)
	if err != nil {
		req.Reject(nil)
		return Result{}, err
	}
	defer c.close()
	// rping's server buffer is its own -S; this one takes any client size.
	buf, err := c.register(MaxSize+1, gowarp.LocalWrite|gowarp.RemoteRead|gowarp.RemoteWrite)
	if err != nil {
		req.Reject(nil)
		return Result{}, err
	}
	// The receive for the client's first advertisement is posted before
	// the reply goes out; the server then stays silent until the client's
	// first Send (RFC 5044: the responder waits for the initiator's FPDU).
	if err := c.postRecv(); err != nil {
		req.Reject(nil)
		return Result{}, err
	}
	if err := req.Accept(ctx, c.qp, o.Connect); err != nil {
		return Result{}, err
	}
	r, err := serve(ctx, c, buf, o)
	if errors.Is(err, ErrDisconnected) {
		err = nil
	}
	dctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	c.qp.Disconnect(dctx)
	return r, err
}

func serve(ctx context.Context, c *conn, buf *gowarp.MR, o ServerOptions) (Result, error) {
	var r Result
	t0 := time.Now()
	for ping := 0; o.Count == 0 || ping < o.Count; ping++ {
		// The client's start buffer.
		src, err := c.recvInfo(ctx)
		if err != nil {
			return r, ctxErr(ctx, err)
		}
		ts := time.Now()
		if src.Size > uint32(buf.Len()) {
			return r, fmt.Errorf("rping: client advertises %d bytes, at most %d", src.Size, buf.Len())
		}
		if err := c.qp.PostSend(&gowarp.SendWR{ID: 3, Op: gowarp.OpRead, Flags: gowarp.Signaled,
			SGL: []gowarp.SGE{{MR: buf, Length: int(src.Size)}}, RemoteAddr: src.Buf, RKey: gowarp.STag(src.RKey)}); err != nil {
			return r, err
		}
		if _, err := c.wait(ctx, gowarp.CompRead); err != nil {
			return r, ctxErr(ctx, fmt.Errorf("ping %d, reading the start buffer: %w", ping, err))
		}
		data := buf.Bytes()[:src.Size]
		if o.Verbose != nil {
			fmt.Fprintf(o.Verbose, "server ping data: %s\n", CString(data))
		}
		if err := c.sendInfo(Info{}); err != nil {
			return r, err
		}
		// The client's sink buffer: rping writes strlen+1 bytes back.
		sink, err := c.recvInfo(ctx)
		if err != nil {
			return r, ctxErr(ctx, fmt.Errorf("ping %d, waiting for the sink buffer: %w", ping, err))
		}
		n := min(len(CString(data))+1, len(data))
		if uint32(n) > sink.Size {
			return r, fmt.Errorf("rping: client's sink of %d bytes cannot take the %d bytes read", sink.Size, n)
		}
		if err := c.qp.PostSend(&gowarp.SendWR{ID: 4, Op: gowarp.OpWrite, Flags: gowarp.Signaled,
			SGL: []gowarp.SGE{{MR: buf, Length: n}}, RemoteAddr: sink.Buf, RKey: gowarp.STag(sink.RKey)}); err != nil {
			return r, err
		}
		if _, err := c.wait(ctx, gowarp.CompWrite); err != nil {
			return r, ctxErr(ctx, fmt.Errorf("ping %d, writing the sink buffer: %w", ping, err))
		}
		if err := c.sendInfo(Info{}); err != nil {
			return r, err
		}
		rtt := time.Since(ts)
		if r.MinRTT == 0 || rtt < r.MinRTT {
			r.MinRTT = rtt
		}
		r.Pings++
		r.Elapsed = time.Since(t0)
	}
	return r, nil // Disconnect lets the last go-ahead leave first
}

// lockedWriter serialises the writes of concurrent sessions.
type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}
