package gowarp_test

import (
	"context"
	"io"
	"net"
	"runtime"
	"testing"

	"github.com/gowarp/gowarp"
)

// benchWrite keeps depth Writes of size bytes in flight, signaling one in
// every depth/2.
func benchWrite(b *testing.B, size, depth int, o gowarp.ConnectOptions) {
	p := newPair(b, o)
	src, _ := p.reg(b, size, 0)
	dst, _ := p.reg(b, size, gowarp.RemoteWrite)
	wr := gowarp.SendWR{Op: gowarp.OpWrite, SGL: []gowarp.SGE{{MR: src, Length: size}}, RemoteAddr: dst.Addr(), RKey: uint32(dst.STag())}
	var wc [64]gowarp.Completion
	sig := max(1, depth/2)
	outstanding := 0
	b.SetBytes(int64(size))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		wr.Flags = 0
		if i%sig == sig-1 || i == b.N-1 {
			wr.Flags = gowarp.Signaled
		}
		for outstanding >= depth {
			n := p.acq.Poll(wc[:])
			if n == 0 {
				p.acq.Wait(context.Background())
			}
			outstanding -= n * sig
		}
		if err := p.a.PostSend(&wr); err != nil {
			b.Fatal(err)
		}
		outstanding++
	}
	for outstanding > 0 && p.a.Err() == nil {
		n := p.acq.Poll(wc[:])
		if n == 0 {
			p.acq.Wait(context.Background())
		}
		outstanding -= n * sig
	}
	b.StopTimer()
	// The last Writes must have landed for the figure to be honest.
	for dst.Placed() < uint64(size)*uint64(b.N) && p.b.Err() == nil {
		runtime.Gosched()
	}
}

func BenchmarkWrite64K(b *testing.B)    { benchWrite(b, 64<<10, 32, gowarp.ConnectOptions{}) }
func BenchmarkWrite64KCRC(b *testing.B) { benchWrite(b, 64<<10, 32, gowarp.ConnectOptions{CRC: true}) }
func BenchmarkWrite64(b *testing.B)     { benchWrite(b, 64, 64, gowarp.ConnectOptions{}) }

// BenchmarkTCP64K is the floor: one plain TCP write of 64 KiB per message.
func BenchmarkTCP64K(b *testing.B) { benchTCP(b, 64<<10) }
func BenchmarkTCP64(b *testing.B)  { benchTCP(b, 64) }

func benchTCP(b *testing.B, size int) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	done := make(chan int64)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		buf := make([]byte, size)
		var n int64
		for {
			k, err := io.ReadFull(c, buf)
			n += int64(k)
			if err != nil {
				done <- n
				return
			}
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	msg := make([]byte, size)
	b.SetBytes(int64(size))
	b.ResetTimer()
	for range b.N {
		if _, err := c.Write(msg); err != nil {
			b.Fatal(err)
		}
	}
	c.(*net.TCPConn).CloseWrite()
	<-done
	b.StopTimer()
	c.Close()
}
