// Command guestfwd carries one guest connection to a host server for
// QEMU's guestfwd (cmd:): QEMU runs it with its standard input and output
// a socket to the guest's connection, and it joins them to a new TCP
// connection to 127.0.0.1:PORT.
//
//	guestfwd PORT
//
// Each side's half-close reaches the other: the guest's FIN becomes a FIN
// to the host server, and the host server's FIN one to the guest. nc, used
// before, passed the first on (-N) but not the second: it keeps its output
// open until it exits, which it does only once the guest has closed too,
// so a guest client never learned that a host server had closed first.
package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: guestfwd PORT")
		os.Exit(2)
	}
	c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", os.Args[1]))
	if err != nil {
		fmt.Fprintln(os.Stderr, "guestfwd:", err)
		os.Exit(1)
	}
	tc := c.(*net.TCPConn)
	up := make(chan struct{})
	go func() {
		defer close(up)
		io.Copy(tc, os.Stdin)
		tc.CloseWrite()
	}()
	io.Copy(os.Stdout, tc)
	// The host server closed (or reset): end the guest's input.
	if err := syscall.Shutdown(1, syscall.SHUT_WR); errors.Is(err, syscall.ENOTSOCK) {
		os.Stdout.Close()
	}
	<-up
}
