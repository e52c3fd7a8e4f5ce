package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/creack/pty"
)

// quickProgress shows progress from the start, for tests whose runs are
// short.
func quickProgress(t *testing.T) {
	d, tick := progressDelay, progressTick
	progressDelay, progressTick = 0, 5*time.Millisecond
	t.Cleanup(func() { progressDelay, progressTick = d, tick })
}

// ptyOutput runs gowarp with its stderr on a pseudo-terminal and returns
// what the terminal got, and the stdout.
func ptyOutput(t *testing.T, args ...string) (code int, term, stdout string) {
	t.Helper()
	ptmx, tty, err := pty.Open()
	if err != nil {
		t.Skipf("no pseudo-terminal here: %v", err)
	}
	defer ptmx.Close()
	var mu sync.Mutex
	var got bytes.Buffer
	read := make(chan struct{})
	go func() {
		defer close(read)
		buf := make([]byte, 4096)
		for {
			n, err := ptmx.Read(buf)
			mu.Lock()
			got.Write(buf[:n])
			mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	var out syncBuffer
	code = dispatch(context.Background(), args, &out, tty)
	// Let the reader drain what the command wrote before hanging up.
	if _, err := tty.Write([]byte("<end>")); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		mu.Lock()
		done := strings.Contains(got.String(), "<end>")
		mu.Unlock()
		if done || time.Now().After(deadline) {
			break
		}
	}
	tty.Close()
	ptmx.Close()
	<-read
	mu.Lock()
	defer mu.Unlock()
	return code, strings.TrimSuffix(got.String(), "<end>"), out.String()
}

func TestProgressOnTerminal(t *testing.T) {
	quickProgress(t)
	code, term, out := ptyOutput(t, "perf", "-sweep", "-iters", "2", "-test", "read_lat,tcp_bw")
	if code != exitOK {
		t.Fatalf("exit %d: %q", code, term)
	}
	for _, want := range []string{"[1/40] read_lat 2 B", "[11/40] read_lat 2K", "[20/40] read_lat 1M", "[21/40] tcp_bw 2 B", "[40/40] tcp_bw 1M", "elapsed"} {
		if !strings.Contains(term, want) {
			t.Errorf("terminal lacks %q:\n%q", want, term)
		}
	}
	// The status line is gone at the end, and stays out of the results.
	if !strings.HasSuffix(term, "\r\x1b[K") {
		t.Errorf("terminal output does not end by clearing the status line: %q", term[max(0, len(term)-80):])
	}
	if strings.Contains(out, "\x1b") || strings.Contains(out, "[1/40]") || strings.Count(out, "\n") != 42 {
		t.Errorf("stdout:\n%q", out)
	}
}

// TestProgressKeepsLinesWhole: results on stdout and log lines on stderr
// both start on a line of their own, never after the status line.
func TestProgressKeepsLinesWhole(t *testing.T) {
	quickProgress(t)
	code, term, _ := ptyOutput(t, "perf", "-v", "-sweep", "-iters", "2", "-test", "read_lat")
	if code != exitOK {
		t.Fatalf("exit %d: %q", code, term)
	}
	if !strings.Contains(term, "level=DEBUG") || !strings.Contains(term, "[20/20]") {
		t.Fatalf("no log lines or no progress:\n%q", term)
	}
	for i := 0; ; {
		j := strings.Index(term[i:], "left)")
		if j < 0 {
			break
		}
		i += j + len("left)")
		if i < len(term) && term[i] != '\r' {
			t.Fatalf("status line followed by %q", term[i:min(len(term), i+40)])
		}
	}
}

// TestProgressQuiet: with -json, or when stderr is a pipe or a file,
// there is no progress at all.
func TestProgressQuiet(t *testing.T) {
	quickProgress(t)
	code, term, out := ptyOutput(t, "perf", "-json", "-sweep", "-iters", "2", "-test", "read_lat")
	if code != exitOK || term != "" || strings.Count(out, "\n") != 20 {
		t.Errorf("-json on a terminal: exit %d, terminal %q, %d lines", code, term, strings.Count(out, "\n"))
	}

	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	piped := make(chan string)
	go func() {
		b, _ := io.ReadAll(r)
		piped <- string(b)
	}()
	var stdout syncBuffer
	code = dispatch(context.Background(), []string{"perf", "-sweep", "-iters", "2", "-test", "read_lat"}, &stdout, w)
	w.Close()
	if s := <-piped; code != exitOK || s != "" {
		t.Errorf("stderr a pipe: exit %d, it got %q", code, s)
	}

	f, err := os.Create(t.TempDir() + "/stderr")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	code = dispatch(context.Background(), []string{"perf", "-sweep", "-iters", "2", "-test", "read_lat"}, &stdout, f)
	if b, _ := os.ReadFile(f.Name()); code != exitOK || len(b) != 0 {
		t.Errorf("stderr a file: exit %d, it got %q", code, b)
	}
}

// TestProgressWaits: a run shorter than progressDelay shows nothing even
// on a terminal.
func TestProgressWaits(t *testing.T) {
	d := progressDelay
	progressDelay = time.Hour
	t.Cleanup(func() { progressDelay = d })
	code, term, _ := ptyOutput(t, "perf", "-test", "tcp_lat", "-iters", "2")
	if code != exitOK || term != "" {
		t.Errorf("exit %d, terminal %q", code, term)
	}
}
