package perf

import (
	"context"
	"net"

	"github.com/gowarp/gowarp"
)

// Loopback is a Server serving on 127.0.0.1 in this process and a Client
// of it: the same code as two processes, over the loopback interface.
type Loopback struct {
	Client *Client
	Addr   string // the server's iWARP address
	cancel context.CancelFunc
	done   chan error
}

// StartLoopback starts srv on 127.0.0.1 (a free port and the one after it).
func StartLoopback(srv *Server) (*Loopback, error) {
	ln, tln, err := Listen(gowarp.Open(gowarp.WithLogger(srv.log())), "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &Loopback{
		Client: &Client{Addr: ln.Addr().String(), TCPAddr: tln.Addr().(*net.TCPAddr).String()},
		Addr:   ln.Addr().String(),
		cancel: cancel,
		done:   make(chan error, 1),
	}
	go func() { l.done <- srv.Serve(ctx, ln, tln) }()
	return l, nil
}

// Close stops the server and waits for its sessions to end.
func (l *Loopback) Close() error {
	l.cancel()
	return <-l.done
}
