package rpc

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
	"github.com/gowarp/gowarp/internal/testwatch"
)

// The helper process: GOWARP_RPC_HELPER=server serves the test methods
// and prints its address; =client ADDR makes 8 calls of "wait" and
// prints "calling".
func TestMain(m *testing.M) {
	switch os.Getenv("GOWARP_RPC_HELPER") {
	case "server":
		dev := gowarp.Open(gowarp.WithLogger(quiet))
		ln, err := dev.Listen("127.0.0.1:0")
		if err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		srv := NewServer(dev, Options{Logger: quiet})
		registerTest(srv)
		fmt.Println(ln.Addr())
		srv.Serve(context.Background(), ln)
		os.Exit(0)
	case "client":
		dev := gowarp.Open(gowarp.WithLogger(quiet))
		cl, err := Dial(context.Background(), dev, os.Getenv("GOWARP_RPC_ADDR"), Options{Logger: quiet})
		if err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		for range 8 {
			go cl.Call(context.Background(), "wait", nil, nil)
		}
		fmt.Println("calling")
		select {}
	}
	os.Exit(testwatch.Run(m))
}

// helper starts this test binary as a helper process.
func helper(t *testing.T, role string, env ...string) (*exec.Cmd, *bufio.Scanner) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), append(env, "GOWARP_RPC_HELPER="+role)...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	sc := bufio.NewScanner(out)
	if !sc.Scan() || strings.HasPrefix(sc.Text(), "error") {
		t.Fatalf("helper %s: %q %v", role, sc.Text(), sc.Err())
	}
	return cmd, sc
}

// TestServerKilledMidCall: a server process killed while a call waits
// ends the call with ErrSessionClosed, well before its deadline, and
// every later call too.
func TestServerKilledMidCall(t *testing.T) {
	cmd, sc := helper(t, "server")
	addr := sc.Text()
	cl, err := Dial(context.Background(), gowarp.Open(gowarp.WithLogger(quiet)), addr, Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := cl.Call(context.Background(), "echo", []byte("up"), nil); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	errc := make(chan error, 4)
	for range 4 {
		go func() {
			_, err := cl.Call(ctx, "wait", nil, nil)
			errc <- err
		}()
	}
	for cl.freeSlots() > defaultSlots-4 {
		time.Sleep(time.Millisecond)
	}
	cmd.Process.Kill()
	for range 4 {
		if err := <-errc; !errors.Is(err, ErrSessionClosed) {
			t.Fatalf("call when the server died: %v", err)
		}
	}
	if _, err := cl.Call(ctx, "echo", nil, nil); !errors.Is(err, ErrSessionClosed) {
		t.Fatalf("call after: %v", err)
	}
}

// TestClientKilledWithCallsOutstanding: when a client process dies with
// calls outstanding, their handlers see their contexts end, and the
// server serves other sessions on.
func TestClientKilledWithCallsOutstanding(t *testing.T) {
	dev := gowarp.Open(gowarp.WithLogger(quiet))
	ln, err := dev.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(dev, Options{Logger: quiet})
	registerTest(srv)
	var running, ended atomic.Int32
	srv.Register("wait", func(ctx context.Context, c *ServerCall) error {
		running.Add(1)
		<-ctx.Done()
		ended.Add(1)
		return ctx.Err()
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go srv.Serve(ctx, ln)
	defer srv.Close()
	defer ln.Close()

	cmd, _ := helper(t, "client", "GOWARP_RPC_ADDR="+ln.Addr().String())
	for running.Load() < 8 {
		time.Sleep(time.Millisecond)
	}
	cmd.Process.Kill()
	for ended.Load() < 8 {
		time.Sleep(time.Millisecond)
	}
	cl, err := Dial(context.Background(), dev, ln.Addr().String(), Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if r, err := cl.Call(context.Background(), "echo", []byte("next"), nil); err != nil || string(r) != "next" {
		t.Fatalf("another session after: %q %v", r, err)
	}
}
