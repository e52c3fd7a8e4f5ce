package cm

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"
)

// Dial opens the TCP connection of an initiator, Nagle's algorithm off.
// A peer that does not answer fails it after linkTimeout (see Options),
// or when ctx ends if that comes first: TCP alone tries for about two
// minutes.
func Dial(ctx context.Context, addr string, timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: linkTimeout(timeout)}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	SetNoDelay(c)
	return c, nil
}

// SetNoDelay turns Nagle's algorithm off, so that FPDUs leave at once (siw
// does the same), on a TCP connection or the one under a TLS connection
// (anything with a NetConn method); other streams are left alone.
func SetNoDelay(c net.Conn) {
	for range 4 { // a few layers of wrapping at most
		switch t := c.(type) {
		case *net.TCPConn:
			t.SetNoDelay(true)
			return
		case interface{ NetConn() net.Conn }:
			c = t.NetConn()
		default:
			return
		}
	}
}

// RequestTimeout bounds the wait for an MPA request on an accepted
// connection (siw waits 5 s).
const RequestTimeout = 5 * time.Second

// Listener is the responder's side of connection setup over any
// net.Listener: it accepts connections and reads each one's MPA request
// on its own goroutine, so that a peer that connects and stays silent, or
// speaks something else, holds up nobody; such a peer is dropped and
// logged.
type Listener struct {
	ln   net.Listener
	log  *slog.Logger
	reqs chan *Request
	done chan struct{}
	once sync.Once
	err  error // why the accept loop ended; read after reqs is closed
}

// Listen starts accepting on ln. The Listener owns ln from then on.
func Listen(ln net.Listener, log *slog.Logger) *Listener {
	l := &Listener{ln: ln, log: log, reqs: make(chan *Request, 64), done: make(chan struct{})}
	go l.acceptLoop()
	return l
}

func (l *Listener) acceptLoop() {
	defer close(l.reqs)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := l.ln.Accept()
		if err != nil {
			l.err = err
			return
		}
		wg.Go(func() { l.handshake(c) })
	}
}

// handshake reads one connection's MPA request and queues it for Accept.
func (l *Listener) handshake(c net.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), RequestTimeout)
	defer cancel()
	stop := context.AfterFunc(ctx, func() {
		select {
		case <-l.done:
			c.Close()
		default:
		}
	})
	defer stop()
	req, err := ReadRequest(ctx, c)
	if err != nil {
		l.log.Info("gowarp: dropped connection", "peer", c.RemoteAddr(), "err", err)
		return
	}
	select {
	case l.reqs <- req:
	case <-l.done:
		c.Close()
	}
}

// Addr returns the listening address.
func (l *Listener) Addr() net.Addr { return l.ln.Addr() }

// Close stops listening; requests not yet accepted are dropped.
func (l *Listener) Close() error {
	err := l.ln.Close()
	l.once.Do(func() {
		close(l.done)
		go func() { // drop what was queued
			for r := range l.reqs {
				r.c.Close()
			}
		}()
	})
	return err
}

// Accept waits for the next connection request, until ctx is done or the
// listener is closed (net.ErrClosed).
func (l *Listener) Accept(ctx context.Context) (*Request, error) {
	select {
	case r, ok := <-l.reqs:
		if !ok {
			return nil, fmt.Errorf("gowarp: listener: %w", l.err)
		}
		select {
		case <-l.done:
			r.c.Close()
			return nil, net.ErrClosed
		default:
		}
		return r, nil
	case <-l.done:
		return nil, net.ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
