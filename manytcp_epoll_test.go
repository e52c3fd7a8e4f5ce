//go:build linux

package gowarp_test

import (
	"fmt"
	"net"
	"os"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// BenchmarkManyTCPEpoll is BenchmarkManyTCP with an event-loop server:
// one goroutine serves every connection from an epoll set of its own,
// which waits in Go's netpoller (an epoll descriptor is itself pollable),
// instead of a goroutine per connection. It tells whether a server that
// wakes once for many ready sockets keeps its rate as N grows where
// goroutine-per-connection servers (gowarp's queue pairs, BenchmarkManyTCP)
// lose it; see the README's many-QPs paragraph for what it showed.
func BenchmarkManyTCPEpoll(b *testing.B) {
	for _, n := range benchNs([]int{1, 16, 64, 256}) {
		b.Run(fmt.Sprintf("N=%d", n), func(b *testing.B) { benchManyTCPEpoll(b, n) })
	}
}

// epConn is one connection of the event-loop server: its descriptor (a
// duplicate, read directly), the net.Conn it answers through, and what
// it has read of its next messages.
type epConn struct {
	fd   int
	c    net.Conn
	buf  []byte
	r, w int
}

func benchManyTCPEpoll(b *testing.B, n int) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		b.Fatal(err)
	}
	if err := unix.SetNonblock(epfd, true); err != nil {
		b.Fatal(err)
	}
	ep := os.NewFile(uintptr(epfd), "epoll")
	defer ep.Close()
	rc, err := ep.SyscallConn()
	if err != nil {
		b.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns = map[int32]*epConn{}
		files []*os.File // the duplicates, kept open while served
	)
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, f := range files {
			f.Close()
		}
		for _, c := range conns {
			c.c.Close()
		}
	}()
	var served sync.WaitGroup
	served.Add(2)
	defer served.Wait()
	defer ep.Close()
	defer ln.Close()
	go func() { // accept, and add each connection to the set
		defer served.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			f, err := c.(*net.TCPConn).File()
			if err != nil {
				c.Close()
				return
			}
			fd := int(f.Fd())
			mu.Lock()
			files = append(files, f)
			conns[int32(fd)] = &epConn{fd: fd, c: c, buf: make([]byte, 64<<10)}
			mu.Unlock()
			if err := unix.SetNonblock(fd, true); err != nil {
				return
			}
			if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}); err != nil {
				return
			}
		}
	}()
	go func() { // the event loop: store Writes, answer Reads
		defer served.Done()
		evs := make([]unix.EpollEvent, 128)
		answer := make([]byte, tcpOpSize)
		for {
			var k int
			var werr error
			err := rc.Read(func(uintptr) bool {
				k, werr = unix.EpollWait(epfd, evs, 0)
				return k != 0 || (werr != nil && werr != unix.EINTR)
			})
			if err != nil || werr != nil {
				return // the set was closed
			}
			for _, ev := range evs[:k] {
				mu.Lock()
				c := conns[ev.Fd]
				mu.Unlock()
				for {
					m, err := unix.Read(c.fd, c.buf[c.w:])
					if m <= 0 || err != nil {
						break // EAGAIN: drained; or closed, seen by the client
					}
					c.w += m
					for c.w-c.r >= tcpHdr {
						if c.buf[c.r] == 'W' {
							if c.w-c.r < tcpHdr+tcpOpSize {
								break
							}
							c.r += tcpHdr + tcpOpSize
							continue
						}
						c.r += tcpHdr
						if _, err := c.c.Write(answer); err != nil {
							return
						}
					}
					c.w = copy(c.buf, c.buf[c.r:c.w])
					c.r = 0
				}
			}
		}
	}()
	measureManyTCP(b, ln.Addr().String(), n)
}
