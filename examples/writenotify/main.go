// Command writenotify shows an RDMA Write whose arrival the target learns
// of:
//
//	writenotify server [-a ADDR] [-p 7473] [-size 4096]
//	writenotify client [-s 127.0.0.1] [-p 7473] [-text TEXT]
//
// An RDMA Write makes no completion at the target. Here the client posts a
// Write into the server's advertised buffer and, right behind it on the
// same queue pair, a small Send saying where and how much it wrote. iWARP
// (RFC 5040 §5.5) delivers the Send's completion only after every message
// before it on the connection is placed, so when the server's receive
// completes, the written bytes are in its buffer. (A target that only
// needs to know that bytes arrived can also wait on MR.WaitPlaced.)
package main

import (
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"strconv"
	"time"

	"github.com/gowarp/gowarp"
)

func main() {
	log.SetFlags(0)
	log.SetPrefix("writenotify: ")
	if len(os.Args) < 2 || (os.Args[1] != "server" && os.Args[1] != "client") {
		fmt.Fprintln(os.Stderr, "usage: writenotify server|client [flags]  (writenotify server -h for the flags)")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	fs := flag.NewFlagSet("writenotify "+os.Args[1], flag.ExitOnError)
	port := fs.Int("p", 7473, "port")
	var err error
	if os.Args[1] == "server" {
		addr := fs.String("a", "", "address to listen on (default all)")
		size := fs.Int("size", 4096, "size of the buffer the client may write")
		fs.Parse(os.Args[2:])
		err = serve(ctx, net.JoinHostPort(*addr, strconv.Itoa(*port)), *size)
	} else {
		server := fs.String("s", "127.0.0.1", "server address")
		text := fs.String("text", "written with RDMA Write, announced by a Send", "what to write")
		timeout := fs.Duration("timeout", 10*time.Second, "give up after this long")
		fs.Parse(os.Args[2:])
		ctx, cancel := context.WithTimeout(ctx, *timeout)
		defer cancel()
		err = write(ctx, net.JoinHostPort(*server, strconv.Itoa(*port)), []byte(*text))
	}
	if err != nil {
		log.Fatal(err)
	}
}

// The notice, and the advertisement in the connection reply, are two
// big-endian numbers: an address (or offset) and a length.
func put(b []byte, a uint64, n uint32) []byte {
	binary.BigEndian.PutUint64(b, a)
	binary.BigEndian.PutUint32(b[8:], n)
	return b[:12]
}

func get(b []byte) (uint64, uint32, error) {
	if len(b) < 12 {
		return 0, 0, fmt.Errorf("%d bytes, want 12", len(b))
	}
	return binary.BigEndian.Uint64(b), binary.BigEndian.Uint32(b[8:]), nil
}

func serve(ctx context.Context, addr string, size int) error {
	dev := gowarp.Open()
	pd := dev.AllocPD()
	ln, err := dev.Listen(addr)
	if err != nil {
		return err
	}
	defer ln.Close()
	sink := make([]byte, size)
	sinkMR, err := pd.Register(sink, gowarp.RemoteWrite)
	if err != nil {
		return err
	}
	notice := make([]byte, 12)
	noticeMR, err := pd.Register(notice, gowarp.LocalWrite)
	if err != nil {
		return err
	}
	cq := dev.NewCQ(4)
	qp, err := pd.NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq, RecvDepth: 1})
	if err != nil {
		return err
	}
	defer qp.Close()
	if err := qp.PostRecv(&gowarp.RecvWR{ID: 1, SGL: []gowarp.SGE{{MR: noticeMR, Length: len(notice)}}}); err != nil {
		return err
	}
	fmt.Println("listening on", ln.Addr())
	req, err := ln.Accept(ctx)
	if err != nil {
		return err
	}
	// Advertise the sink: address and length as in a notice, then the STag.
	ad := binary.BigEndian.AppendUint32(put(make([]byte, 12), sinkMR.Addr(), uint32(sinkMR.Len())), uint32(sinkMR.STag()))
	if err := req.Accept(ctx, qp, gowarp.ConnectOptions{PrivateData: ad}); err != nil {
		return err
	}
	var wc [1]gowarp.Completion
	for cq.Poll(wc[:]) == 0 {
		if err := cq.Wait(ctx); err != nil {
			return err
		}
	}
	if err := wc[0].Err(); err != nil {
		return fmt.Errorf("waiting for the notice: %w", err)
	}
	at, n, err := get(notice[:wc[0].Bytes])
	if err != nil {
		return fmt.Errorf("notice: %w", err)
	}
	off := at - sinkMR.Addr()
	if at < sinkMR.Addr() || off+uint64(n) > uint64(len(sink)) {
		return fmt.Errorf("notice names bytes [%#x, +%d) outside the buffer", at, n)
	}
	fmt.Printf("notified: %d bytes at offset %d (%d placed in all): %q\n", n, off, sinkMR.Placed(), sink[off:off+uint64(n)])
	return qp.Disconnect(ctx)
}

func write(ctx context.Context, addr string, data []byte) error {
	dev := gowarp.Open()
	pd := dev.AllocPD()
	cq := dev.NewCQ(4)
	qp, err := pd.NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq})
	if err != nil {
		return err
	}
	defer qp.Close()
	if err := qp.Connect(ctx, addr, gowarp.ConnectOptions{}); err != nil {
		return err
	}
	pdata := qp.PeerPrivateData()
	if len(pdata) < 16 {
		return fmt.Errorf("server's private data %x: want 16 bytes", pdata)
	}
	sinkAddr, sinkLen, _ := get(pdata)
	stag := binary.BigEndian.Uint32(pdata[12:])
	// The data and the notice in one registered buffer.
	buf := append(append([]byte{}, data...), make([]byte, 12)...)
	mr, err := pd.Register(buf, 0) // read only by the local QP: no rights needed
	if err != nil {
		return err
	}
	const at = 64 // write at an offset, so the notice has something to say
	if len(data)+at > int(sinkLen) {
		return fmt.Errorf("%d bytes at offset %d do not fit the server's %d", len(data), at, sinkLen)
	}
	put(buf[len(data):], sinkAddr+at, uint32(len(data)))
	// Write unsignaled, then the Send: one doorbell, one completion.
	wrs := []gowarp.SendWR{
		{ID: 1, Op: gowarp.OpWrite, SGL: []gowarp.SGE{{MR: mr, Length: len(data)}}, RemoteAddr: sinkAddr + at, RKey: gowarp.STag(stag)},
		{ID: 2, Op: gowarp.OpSend, Flags: gowarp.Signaled, SGL: []gowarp.SGE{{MR: mr, Offset: len(data), Length: 12}}},
	}
	if _, err := qp.PostSendList(wrs); err != nil {
		return err
	}
	var wc [1]gowarp.Completion
	for cq.Poll(wc[:]) == 0 {
		if err := cq.Wait(ctx); err != nil {
			return err
		}
	}
	if err := wc[0].Err(); err != nil {
		return fmt.Errorf("work request %d: %w", wc[0].ID, err)
	}
	fmt.Printf("wrote %d bytes and sent the notice\n", len(data))
	return qp.Disconnect(ctx)
}
