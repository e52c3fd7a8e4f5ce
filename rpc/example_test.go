package rpc_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"

	"github.com/gowarp/gowarp"
	"github.com/gowarp/gowarp/rpc"
)

// A server counts the lines of a 1 MiB argument it reads by reference,
// and a client calls it by value and by reference.
func Example() {
	ctx := context.Background()
	quiet := slog.New(slog.DiscardHandler)
	dev := gowarp.Open(gowarp.WithLogger(quiet))
	ln, err := dev.Listen("127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()

	srv := rpc.NewServer(dev, rpc.Options{Logger: quiet})
	srv.RegisterFunc("hello", func(ctx context.Context, arg []byte) ([]byte, error) {
		return fmt.Appendf(nil, "hello, %s", arg), nil
	})
	srv.Register("lines", func(ctx context.Context, c *rpc.ServerCall) error {
		r, err := c.Ref(0)
		if err != nil {
			return err
		}
		// Only what the section reader reads is fetched, with RDMA Read.
		n, buf := 0, make([]byte, 32<<10)
		sr := io.NewSectionReader(r, 0, r.Len())
		for {
			k, err := sr.Read(buf)
			n += bytes.Count(buf[:k], []byte("\n"))
			if err == io.EOF {
				break
			}
			if err != nil {
				return err
			}
		}
		return c.Reply(fmt.Append(c.ReplyBuffer(), n))
	})
	go srv.Serve(ctx, ln)
	defer srv.Close()

	cl, err := rpc.Dial(ctx, dev, ln.Addr().String(), rpc.Options{Logger: quiet})
	if err != nil {
		log.Fatal(err)
	}
	defer cl.Close()

	reply, err := cl.Call(ctx, "hello", []byte("rpc"), nil)
	fmt.Printf("%s %v\n", reply, err)

	buf, err := cl.Alloc(1 << 20)
	if err != nil {
		log.Fatal(err)
	}
	defer buf.Free()
	for i := range buf.Bytes() {
		buf.Bytes()[i] = "abc\n"[i%4]
	}
	call := rpc.Call{Method: "lines", Refs: []rpc.Span{buf.All()}}
	err = cl.Do(ctx, &call)
	fmt.Printf("%s lines %v\n", call.Reply, err)

	_, err = cl.Call(ctx, "nope", nil, nil)
	fmt.Println(err)
	// Output:
	// hello, rpc <nil>
	// 262144 lines <nil>
	// rpc: nope: no method "nope"
}
