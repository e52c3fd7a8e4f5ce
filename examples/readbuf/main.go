// Command readbuf advertises a buffer and has the peer read it one-sided:
//
//	readbuf server [-a ADDR] [-p 7472] [-text TEXT]
//	readbuf client [-s 127.0.0.1] [-p 7472]
//
// The server registers a buffer for remote reads and sends its address,
// STag and length in the MPA private data of its connection reply (16
// bytes, big-endian). The client reads the whole buffer with one RDMA Read:
// the server's CPU takes no part, and it learns the client is done only
// when the connection goes away, from the flushed receive it left posted
// for that purpose.
package main

import (
	"context"
	"encoding/binary"
	"errors"
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

// advert is what the server tells the client about its buffer.
type advert struct {
	addr uint64
	stag uint32
	len  uint32
}

func (a advert) marshal() []byte {
	b := make([]byte, 16)
	binary.BigEndian.PutUint64(b, a.addr)
	binary.BigEndian.PutUint32(b[8:], a.stag)
	binary.BigEndian.PutUint32(b[12:], a.len)
	return b
}

func parseAdvert(b []byte) (advert, error) {
	if len(b) < 16 {
		return advert{}, fmt.Errorf("server sent %d bytes of private data, want 16", len(b))
	}
	return advert{binary.BigEndian.Uint64(b), binary.BigEndian.Uint32(b[8:]), binary.BigEndian.Uint32(b[12:])}, nil
}

func main() {
	log.SetFlags(0)
	log.SetPrefix("readbuf: ")
	if len(os.Args) < 2 || (os.Args[1] != "server" && os.Args[1] != "client") {
		fmt.Fprintln(os.Stderr, "usage: readbuf server|client [flags]  (readbuf server -h for the flags)")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	fs := flag.NewFlagSet("readbuf "+os.Args[1], flag.ExitOnError)
	port := fs.Int("p", 7472, "port")
	var err error
	if os.Args[1] == "server" {
		addr := fs.String("a", "", "address to listen on (default all)")
		text := fs.String("text", "this buffer was read with RDMA Read", "what the buffer holds")
		fs.Parse(os.Args[2:])
		err = serve(ctx, net.JoinHostPort(*addr, strconv.Itoa(*port)), []byte(*text))
	} else {
		server := fs.String("s", "127.0.0.1", "server address")
		timeout := fs.Duration("timeout", 10*time.Second, "give up after this long")
		fs.Parse(os.Args[2:])
		ctx, cancel := context.WithTimeout(ctx, *timeout)
		defer cancel()
		err = read(ctx, net.JoinHostPort(*server, strconv.Itoa(*port)))
	}
	if err != nil {
		log.Fatal(err)
	}
}

// serve exposes buf to one client and returns when the client has gone.
func serve(ctx context.Context, addr string, buf []byte) error {
	dev := gowarp.Open()
	pd := dev.AllocPD()
	ln, err := dev.Listen(addr)
	if err != nil {
		return err
	}
	defer ln.Close()
	// RemoteRead only: the peer may read this buffer, not write it.
	mr, err := pd.Register(buf, gowarp.RemoteRead)
	if err != nil {
		return err
	}
	cq := dev.NewCQ(4)
	qp, err := pd.NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq, RecvDepth: 1})
	if err != nil {
		return err
	}
	defer qp.Close()
	// A receive that no Send will fill: when the client disconnects it is
	// flushed, and that completion says the client is done.
	if err := qp.PostRecv(&gowarp.RecvWR{ID: 1}); err != nil {
		return err
	}
	fmt.Println("listening on", ln.Addr())
	req, err := ln.Accept(ctx)
	if err != nil {
		return err
	}
	ad := advert{addr: mr.Addr(), stag: uint32(mr.STag()), len: uint32(mr.Len())}
	if err := req.Accept(ctx, qp, gowarp.ConnectOptions{PrivateData: ad.marshal()}); err != nil {
		return err
	}
	fmt.Printf("advertised %d bytes at %#x, STag %#x, to %v\n", ad.len, ad.addr, ad.stag, req.RemoteAddr())
	var wc [1]gowarp.Completion
	for cq.Poll(wc[:]) == 0 {
		if err := cq.Wait(ctx); err != nil {
			return err
		}
	}
	if err := wc[0].Err(); !errors.Is(err, gowarp.WRFlushError) {
		return fmt.Errorf("the idle receive completed with %v, want a flush", err)
	}
	fmt.Println("client gone:", qp.Err())
	return nil
}

// read connects, learns where the buffer is, and reads it.
func read(ctx context.Context, addr string) error {
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
	ad, err := parseAdvert(qp.PeerPrivateData())
	if err != nil {
		return err
	}
	// The sink of a Read is written by the local QP: LocalWrite.
	buf := make([]byte, ad.len)
	mr, err := pd.Register(buf, gowarp.LocalWrite)
	if err != nil {
		return err
	}
	if err := qp.PostSend(&gowarp.SendWR{ID: 1, Op: gowarp.OpRead, Flags: gowarp.Signaled,
		SGL: []gowarp.SGE{{MR: mr, Length: len(buf)}}, RemoteAddr: ad.addr, RKey: gowarp.STag(ad.stag)}); err != nil {
		return err
	}
	var wc [1]gowarp.Completion
	for cq.Poll(wc[:]) == 0 {
		if err := cq.Wait(ctx); err != nil {
			return err
		}
	}
	if err := wc[0].Err(); err != nil {
		return fmt.Errorf("RDMA Read: %w", err)
	}
	fmt.Printf("read %d bytes: %q\n", wc[0].Bytes, buf)
	return qp.Disconnect(ctx)
}
